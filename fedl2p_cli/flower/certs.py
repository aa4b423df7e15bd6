"""Test credentials for a secured Flower deployment on a local trial: a certificate authority, the SuperLink's TLS
certificate, and one key pair per SuperNode for Flower's SuperNode authentication.

For a trial only: a real federation's certificates come from an authority its sites trust, and each site makes its
own key pair (`keygen`) and hands over only the public key. Private keys are written owner-only (0600) in a folder
that is owner-only (0700). Uses `cryptography`, which the `flower` extra installs.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from ..errors import FedL2PError

DAYS = 30  # test certificates expire soon on purpose


def _crypto():
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        raise FedL2PError("making test credentials needs the flower extra (pip install -e '.[flower]')") from None
    return x509, hashes, serialization, ec, NameOID


def _write(path: Path, data: bytes, private: bool = False) -> None:
    """A private file is created 0600 (never readable by others, not even for a moment); a public one 0644."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _folder(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o700)


def git_work_tree(path: Path) -> Path | None:
    """The git work tree `path` lies in (where a private key could be committed by mistake), else None."""
    try:
        r = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                           timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(r.stdout.strip()) if r.returncode == 0 and r.stdout.strip() else None


def ignored(path: Path) -> bool:
    """Whether git ignores `path` (so `git add -A` would not pick it up)."""
    try:
        return subprocess.run(["git", "-C", str(path.parent), "check-ignore", "-q", str(path)],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def warning(out: Path) -> str | None:
    """A warning when private keys were written inside a git work tree, None otherwise."""
    tree = git_work_tree(out)
    if tree is None:
        return None
    how = "git ignores it" if ignored(out) else "git does NOT ignore it: add it to .gitignore"
    return f"{out} is inside the git work tree {tree} ({how}); keep private keys out of repositories"


def _ec_pair(ser, ec) -> tuple[bytes, bytes]:
    """An EC key pair for SuperNode authentication: the private key (OpenSSH PEM) and the public key (OpenSSH)."""
    key = ec.generate_private_key(ec.SECP384R1())
    return (key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption()),
            key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH))


def keygen(out: Path, name: str) -> list[Path]:
    """A site's own SuperNode key pair, OUT/NAME.key (private, stays at the site) and OUT/NAME.pub (what the site
    hands to the server operator to register)."""
    _, _, ser, ec, _ = _crypto()
    if not name or "/" in name or name.startswith("."):
        raise FedL2PError(f"--name must be a plain file name, got '{name}'")
    _folder(out)
    private, public = _ec_pair(ser, ec)
    _write(out / f"{name}.key", private, private=True)
    _write(out / f"{name}.pub", public)
    return [out / f"{name}.key", out / f"{name}.pub"]


def _cert(subject: str, key, issuer_name, issuer_key, ca: bool, hosts: Sequence[str] = ()):
    x509, hashes, _, _, NameOID = _crypto()
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    b = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer_name or name).public_key(key.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
         .not_valid_after(now + dt.timedelta(days=DAYS))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if hosts:
        alt = []
        for h in hosts:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                alt.append(x509.DNSName(h))
        b = b.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def make(out: Path, sites: int, hosts: list[str]) -> list[Path]:
    """Write ca.crt, server.pem, server.key and site<i>.key / site<i>.pub (i = 1..sites) under `out`."""
    x509, _, ser, ec, _ = _crypto()
    if sites < 1:
        raise FedL2PError(f"--sites must be at least 1, got {sites}")
    _folder(out)
    pem, pkcs8, none = ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = _cert("fedl2p test CA", ca_key, None, ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP384R1())
    server = _cert(hosts[0], server_key, ca.subject, ca_key, ca=False, hosts=hosts)
    _write(out / "ca.crt", ca.public_bytes(pem))
    _write(out / "server.pem", server.public_bytes(pem))
    _write(out / "server.key", server_key.private_bytes(pem, pkcs8, none), private=True)
    written = [out / "ca.crt", out / "server.pem", out / "server.key"]
    for i in range(1, sites + 1):  # SuperNode authentication: EC key pairs, the public key in OpenSSH form
        private, public = _ec_pair(ser, ec)
        _write(out / f"site{i}.key", private, private=True)
        _write(out / f"site{i}.pub", public)
        written += [out / f"site{i}.key", out / f"site{i}.pub"]
    return written
