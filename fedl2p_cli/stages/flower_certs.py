"""Test credentials for a secured Flower deployment on a local trial: a certificate authority, the SuperLink's TLS
certificate, and one key pair per SuperNode for Flower's SuperNode authentication.

For a trial only: a real federation's certificates come from an authority its sites trust, and each site makes its
own key pair and hands over only the public key. Uses `cryptography`, which the `flower` extra installs.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
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
    path.write_bytes(data)
    if private:
        os.chmod(path, 0o600)


def _cert(subject: str, key, issuer_name, issuer_key, ca: bool, hosts: list[str] = ()):
    x509, hashes, _, _, NameOID = _crypto()
    now = dt.datetime.now(dt.timezone.utc)
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
    out.mkdir(parents=True, exist_ok=True)
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
        key = ec.generate_private_key(ec.SECP384R1())
        _write(out / f"site{i}.key", key.private_bytes(pem, ser.PrivateFormat.OpenSSH, none), private=True)
        _write(out / f"site{i}.pub", key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH))
        written += [out / f"site{i}.key", out / f"site{i}.pub"]
    return written
