"""The Fleet gateway: the one SuperLink address a deployment exposes to the network.

Flower's SuperLink serves its Fleet API (what SuperNodes use), its Control API (`flwr run`, `flwr ls`, `flwr supernode
register`) and its ServerAppIo API (its ServerApps) on one HTTP port, and its open-source edition authenticates no
Control API caller. So the SuperLink listens on loopback only, and this gateway listens on the network and forwards
to it the Fleet API's paths alone (`/v1/fleet/...`); any other path is answered 404 without reaching the SuperLink.
A stranger who reaches the server can then neither register a key nor list or start runs; a SuperNode still
authenticates to the SuperLink itself (the signed headers pass through unchanged). Needs the flower extra (uvicorn,
starlette and httpx come with flwr).
"""

from __future__ import annotations

import ipaddress
from contextlib import asynccontextmanager
from pathlib import Path

from ..errors import FedL2PError

FLEET = "/v1/fleet/"
# per-connection headers, and those the forwarded request or response recomputes
HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers", "transfer-encoding",
       "upgrade", "host", "content-length", "content-encoding"}
TIMEOUT_S = 600.0  # a Fleet call carrying a large model may take a while; a dead SuperLink still ends it


def address(text: str, option: str) -> tuple[str, int]:
    """HOST:PORT as (host, port); a bad one is a one-line error naming the option."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise FedL2PError(f"{option} must be HOST:PORT, got '{text}'")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def fleet_app(upstream: str, verify):
    """An ASGI app forwarding `/v1/fleet/...` requests to `upstream` (the SuperLink's loopback URL); 404 otherwise."""
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    client = httpx.AsyncClient(base_url=upstream, verify=verify, timeout=TIMEOUT_S)

    async def forward(request: Request) -> Response:
        if not request.url.path.startswith(FLEET):
            return PlainTextResponse("not served here: this address serves only the Flower Fleet API\n", 404)
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP]
        try:
            r = await client.request(request.method, target, content=await request.body(), headers=headers)
        except httpx.HTTPError as e:
            return PlainTextResponse(f"the SuperLink did not answer: {type(e).__name__}\n", 502)
        kept = {k: v for k, v in r.headers.items() if k.lower() not in HOP}
        return Response(r.content, r.status_code, headers=kept)

    @asynccontextmanager
    async def lifespan(app):
        yield
        await client.aclose()

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST", "PUT", "DELETE", "PATCH"])],
                     lifespan=lifespan)


def serve(listen: str, superlink: str, certfile: Path | None, keyfile: Path | None, ca: Path | None) -> None:
    """Serve the Fleet API of the SuperLink at `superlink` (loopback) on `listen`, with TLS unless no certificate is
    given (an insecure loopback trial). Runs until interrupted."""
    import uvicorn
    (host, port), (up_host, up_port) = address(listen, "--listen"), address(superlink, "--superlink")
    if not is_loopback(up_host):
        raise FedL2PError(f"--superlink {superlink} is not a loopback address: start the SuperLink on 127.0.0.1 "
                          "(its Control and ServerAppIo APIs must not face the network) and point the gateway there")
    tls = [certfile, keyfile, ca]
    if any(tls) and not all(tls):
        raise FedL2PError("--certfile, --keyfile and --ca go together (TLS), or none of them (an insecure trial)")
    for p, option in zip(tls, ("--certfile", "--keyfile", "--ca")):
        if p is not None and not p.is_file():
            raise FedL2PError(f"{option} {p} does not exist")
    scheme = "https" if ca else "http"
    app = fleet_app(f"{scheme}://{up_host}:{up_port}", str(ca) if ca else False)
    print(f"Fleet gateway: {scheme}://{host}:{port} -> the Fleet API of {scheme}://{up_host}:{up_port} "
          "(Control and ServerAppIo APIs not served)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", ssl_certfile=str(certfile) if certfile else None,
                ssl_keyfile=str(keyfile) if keyfile else None)
