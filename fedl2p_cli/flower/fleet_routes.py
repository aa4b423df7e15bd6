"""What the Fleet gateway forwards: an allowlist of the Fleet API's endpoints, matched on the raw request target.

Flower 1.41's SuperLink declares twelve POST routes under `/v1/fleet` (flwr/superlink/routers/fleet/router.py). A
site that authenticates with a key the operator registered needs ten of them. `register-node` and `unregister-node`
are how a SuperNode *without* a key adds or removes itself: a SuperLink started with `--enable-supernode-auth` refuses
both, and a gateway that forwarded them would only let a stranger probe for that. They are forwarded only when the
operator asks for self-registration (`--allow-self-registration`, an insecure loopback trial).

The decision is made on the bytes the client sent (the ASGI/h11 raw target), and what is forwarded is the allowlist's
own constant, never the client's string: a check and a forward that read different strings (one decoded, one
normalised) is how a path prefix check is bypassed with `..`, `%2e%2e`, `%2f` and the like.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..errors import FedL2PError

PREFIX = "/v1/fleet/"
SITE_ROUTES = ("activate-node", "deactivate-node", "send-node-heartbeat", "pull-messages", "push-messages", "get-run",
               "get-fab", "push-object", "pull-object", "confirm-message-received")
SELF_REGISTRATION = ("register-node", "unregister-node")
FLWR_ROUTES = frozenset(("POST", PREFIX + r) for r in SITE_ROUTES + SELF_REGISTRATION)  # what flwr 1.41 declares
MEDIA_TYPE = b"application/protobuf"  # the only body a Fleet call sends
# request headers passed on: what a SuperNode sends (its protobuf body's type, its version metadata, its signed
# authentication headers); everything else (cookies, forwarding headers, ServerAppIo's task token) stays here
PASSED = frozenset((b"content-type", b"accept", b"user-agent", b"flwr-public-key", b"flwr-signature",
                    b"flwr-timestamp", b"flwr-package-name", b"flwr-package-version", b"flwr-component-name",
                    b"x-flwr-client"))


@dataclass(frozen=True)
class Verdict:
    """A request's fate: `status` 0 forwards to `path` (the allowlist's constant); else that status and its reason."""
    status: int
    path: str = ""
    reason: str = ""


def allowlist(self_registration: bool) -> dict[bytes, str]:
    """Raw target bytes -> the path forwarded for it."""
    routes = SITE_ROUTES + (SELF_REGISTRATION if self_registration else ())
    return {(PREFIX + r).encode("ascii"): PREFIX + r for r in routes}


def decide(method: bytes, target: bytes, host: bytes | None, routes: dict[bytes, str],
           host_name: str | None = None) -> Verdict:
    """Forward a request only when its method is POST, its raw target is one allowlisted path byte for byte (no
    query, no encoding, no dot segment, no absolute form) and, if the gateway names its host, its Host is that."""
    if not target.startswith(b"/"):  # absolute-form (http://x/...) or asterisk-form: never what a SuperNode sends
        return Verdict(400, reason="not an origin-form target")
    if host_name is not None and _host_only(host) != host_name.lower().encode():
        return Verdict(400, reason="Host header is not the gateway's --host-name")
    path = routes.get(target)
    if path is None:
        return Verdict(404, reason="not a Fleet API endpoint this gateway serves")
    if method != b"POST":
        return Verdict(405, reason="the Fleet API takes POST only")
    return Verdict(0, path)


def _host_only(host: bytes | None) -> bytes:
    """The Host header's name without its port, lower-case ([v6] kept whole)."""
    if not host:
        return b""
    h = host.strip().lower()
    if h.startswith(b"["):
        return h.split(b"]")[0] + b"]"
    return h.rsplit(b":", 1)[0] if h.count(b":") == 1 else h


def passed_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The request headers forwarded upstream (names lower-cased by h11)."""
    return [(k, v) for k, v in headers if k.lower() in PASSED]


def check_flwr() -> str:
    """The installed flwr's version, after checking that its SuperLink declares exactly the Fleet routes this
    allowlist was written for; a flwr whose routes differ stops the gateway (a route it does not know could be one a
    site needs, or one that must not face the network)."""
    from importlib.metadata import version
    declared = declared_routes()
    if declared != FLWR_ROUTES:
        new = sorted(f"{m} {p}" for m, p in declared - FLWR_ROUTES)
        gone = sorted(f"{m} {p}" for m, p in FLWR_ROUTES - declared)
        raise FedL2PError(f"flwr {version('flwr')} declares other Fleet routes than the gateway was written for "
                           f"(flwr 1.41; new: {', '.join(new) or 'none'}; gone: {', '.join(gone) or 'none'})")
    return version("flwr")


ROUTES_CODE = ("import json; from flwr.superlink.routers.fleet.router import router; "
               "print(json.dumps([[m, r.path] for r in router.routes for m in getattr(r, 'methods', ())]))")


def declared_routes() -> set[tuple[str, str]]:
    """The (method, path) pairs the installed flwr's Fleet router declares, read in a child process (once per
    `ROUTES_CODE`: about 2 s): importing the router maps grpc, numpy, sqlalchemy and pydantic (about 90 MB resident),
    which the gateway would otherwise keep for as long as it serves."""
    return set(_declared(ROUTES_CODE))


@functools.cache
def _declared(code: str) -> frozenset[tuple[str, str]]:
    import json
    import subprocess
    import sys
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise FedL2PError(f"could not read the installed flwr's Fleet routes: {e}") from None
    try:
        rows = json.loads(done.stdout) if done.returncode == 0 else None
    except ValueError:
        rows = None
    if not isinstance(rows, list):
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise FedL2PError(f"could not read the installed flwr's Fleet routes: {why}")
    return frozenset((str(m), str(p)) for m, p in rows)
