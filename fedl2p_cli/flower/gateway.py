"""The Fleet gateway: the one SuperLink address a deployment exposes to the network.

Flower's SuperLink serves its Fleet API (SuperNodes), its Control API (`flwr run`, `flwr ls`, key registration) and
its ServerAppIo API (its ServerApps) on one HTTP port, and its open-source edition authenticates no Control API
caller. So the SuperLink listens on loopback only and this gateway listens on the network. It is a small HTTP/1.1
server of its own (h11 over asyncio) rather than a general ASGI app, so that it sees the request target exactly as
the client sent it and can bound every phase of a request:

- a request is forwarded only if its method and raw target match the allowlist (`fleet_routes`), and the path sent
  upstream is the allowlist's constant; anything else is answered here (400/404/405/415) and never reaches the
  SuperLink;
- before anything is forwarded: the request head must arrive within `header_timeout`, a body may be at most
  `max_body` bytes (a larger Content-Length is refused unread) and must keep arriving, an idle kept-alive connection is
  closed after `idle_timeout`, and at most `max_connections` are served at once;
- every request is one access-log line (time, peer, method, target, status, bytes in and out, upstream time), and
  the gateway's own failures are one line each, never a traceback.

A SuperNode still authenticates to the SuperLink itself: its signed headers pass through unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import ipaddress
import ssl
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..errors import FedL2PError
from . import fleet_routes as fr

MiB = 1 << 20
# response headers the gateway recomputes or that belong to one connection
HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"content-encoding", b"upgrade",
       b"te", b"trailer", b"proxy-authenticate"}


@dataclass(frozen=True)
class Limits:
    """Bounds applied to every request before it is forwarded (`fedl2p flower gateway --help` documents each)."""
    max_body: int = 4 * MiB
    header_timeout: float = 10.0
    idle_timeout: float = 60.0
    max_connections: int = 128
    max_header: int = 16 * 1024
    upstream_timeout: float = 600.0  # a Fleet call carrying a large object may take a while; a dead SuperLink ends it
    body_timeout: float = 60.0      # a whole body must arrive within this (a trickle at 1 byte / 2 s is ended)
    body_budget: int = 64 * MiB     # bytes of request bodies buffered at once, all connections together
    max_per_peer: int = 16          # connections one address may hold
    unauth_per_minute: int = 30     # calls the SuperLink refused as unauthenticated, per address, before 429


@dataclass
class Conn:
    """One served connection: its address (the peer's IP), its writer (to close it when a site needs the slot), and
    whether a call on it has been accepted upstream (an authenticated site's: never evicted)."""
    ip: str
    writer: asyncio.StreamWriter
    opened: float
    authed: bool = False


class Reject(Exception):
    """A request answered by the gateway itself; the connection is closed after the answer."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


class AccessLog:
    """One line per request and per gateway failure, flushed at once (an operator tails it)."""

    def __init__(self, out: TextIO):
        self.out = out

    def line(self, text: str) -> None:
        self.out.write(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {text}\n")
        self.out.flush()

    def request(self, peer: str, method: bytes, target: bytes, status: int | str, n_in: int, n_out: int,
                upstream_ms: float | None, note: str = "") -> None:
        up = f"{upstream_ms:.1f}" if upstream_ms is not None else "-"
        self.line(f"{peer} {printable(method, 16)} {printable(target, 200)} {status} in={n_in} out={n_out} "
                  f"upstream_ms={up}" + (f" {note}" if note else ""))


def printable(raw: bytes, limit: int) -> str:
    """Bytes as an operator can read them in one log line: non-printables escaped, long ones cut."""
    text = repr(raw[:limit])[2:-1]
    return text + ("..." if len(raw) > limit else "")


class Gateway:
    """Serves connections: parse with h11, decide on the raw target, forward allowlisted calls with httpx."""

    def __init__(self, upstream: str, verify: ssl.SSLContext | bool, routes: dict[bytes, str], limits: Limits,
                 log: AccessLog, host_name: str | None = None):
        import httpx
        self.routes, self.limits, self.log, self.host_name = routes, limits, log, host_name
        self.client = httpx.AsyncClient(base_url=upstream, verify=verify, timeout=limits.upstream_timeout)
        self.conns: list[Conn] = []
        self.buffered = 0  # request-body bytes held now (reserved by declared length before reading)
        self.refused: dict[str, list[float]] = {}  # per address: times the SuperLink answered 401/403 (last minute)
        self.tls: ssl.SSLContext | None = None  # set by `run`: the handshake happens here, so it is bounded and logged

    @property
    def active(self) -> int:
        return len(self.conns)

    def admit(self, ip: str, writer) -> tuple[Conn | None, str]:
        """A slot for a new connection from `ip`, or why not. An address over --max-per-peer is refused; when every
        slot is taken, the oldest connection no call has authenticated is closed for it (a stranger's, never a site's
        that has made an accepted call), and only if there is none is the newcomer refused."""
        mine = sum(c.ip == ip for c in self.conns)
        if mine >= self.limits.max_per_peer:
            return None, f"{mine} connections from this address (--max-per-peer)"
        if self.active >= self.limits.max_connections:
            strangers = [c for c in self.conns if not c.authed]
            if not strangers:
                return None, f"{self.active} connections open, all authenticated (--max-connections)"
            victim = max(strangers, key=lambda c: (sum(d.ip == c.ip for d in self.conns), -c.opened))
            self.conns.remove(victim)
            self.log.line(f"{victim.ip} connection closed for a newcomer: no authenticated call on it, all "
                          f"{self.limits.max_connections} slots taken")
            victim.writer.transport.abort()
        c = Conn(ip, writer, time.monotonic())
        self.conns.append(c)
        return c, ""

    def limited(self, ip: str) -> bool:
        """Whether `ip` has had --unauth-per-minute calls refused as unauthenticated in the last minute."""
        now = time.monotonic()
        times = [t for t in self.refused.pop(ip, []) if now - t < 60.0]
        if times:  # an address with none in the last minute is forgotten
            self.refused[ip] = times
        return len(times) >= self.limits.unauth_per_minute

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer(writer)
        c, why = self.admit(peer.rpartition(":")[0] or peer, writer)
        if c is None:
            self.log.line(f"{peer} refused: {why}")
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            await _close(writer)
            return
        try:
            if self.tls is not None and not await self._handshake(writer, peer):
                return
            await self._serve(reader, writer, peer, c)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, TimeoutError):
            pass  # the peer went away or stalled: nothing to answer
        except Exception as e:  # noqa: BLE001 - the gateway's own failure: one line, the connection closed
            self.log.line(f"{peer} gateway error: {type(e).__name__}: {e}")
        finally:
            if c in self.conns:
                self.conns.remove(c)
            await _close(writer)

    async def _handshake(self, writer, peer: str) -> bool:
        """TLS on the accepted connection, within `header_timeout`; a failure (plain HTTP on the TLS port, a client
        that never speaks, a bad client hello) is one log line."""
        try:
            await writer.start_tls(self.tls, ssl_handshake_timeout=self.limits.header_timeout)
            return True
        except (ssl.SSLError, ConnectionError, TimeoutError, OSError) as e:
            why = getattr(e, "reason", None)
            self.log.line(f"{peer} TLS handshake failed: {type(e).__name__}" + (f": {why}" if why else ""))
            return False

    async def _serve(self, reader, writer, peer: str, c: Conn) -> None:
        """Requests on one connection, in turn: the head, the decision (before a byte of the body is read), the body,
        the forward. Anything answered here closes the connection."""
        import h11
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_header)
        first = True
        while True:
            raw: list[bytes] = []
            req, reserved = None, 0
            try:
                req = await self._head(conn, reader, first, raw)
                if req is None:
                    return
                first = False
                if head_size(req) > self.limits.max_header:  # a whole head in one read escapes h11's own bound
                    raise Reject(431, f"request head over {self.limits.max_header} bytes")
                verdict = fr.decide(req.method, req.target, _header(req, b"host"), self.routes, self.host_name)
                for v in (verdict, framing(req)):
                    if v.status:
                        raise Reject(v.status, v.reason)
                if self.limited(c.ip):
                    raise Reject(429, f"too many unauthenticated calls from this address (--unauth-per-minute "
                                      f"{self.limits.unauth_per_minute})")
                reserved = self.reserve(int(_header(req, b"content-length") or 0))
                body = await self._body(conn, reader, req)
            except h11.RemoteProtocolError as e:
                self.buffered -= reserved
                return await self._reject(conn, writer, peer, req or first_line(raw), Reject(e.error_status_hint,
                                                                                          f"bad request: {e}"))
            except Reject as r:
                self.buffered -= reserved
                return await self._reject(conn, writer, peer, req or first_line(raw), r)
            except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, OSError) as e:
                self.buffered -= reserved
                line = req or first_line(raw)
                if line is not None:  # a request begun, then the peer went away: its line
                    self.log.request(peer, line.method, line.target, "-", 0, 0, None, f"client gone: {type(e).__name__}")
                raise
            try:
                status = await self._forward(conn, writer, peer, req, verdict.path, body)
            finally:
                self.buffered -= reserved
            if status in (401, 403):
                self.refused.setdefault(c.ip, []).append(time.monotonic())
            elif status is not None and status < 400:
                c.authed = True  # the SuperLink accepted a call on this connection: a site's, kept when slots run out
            if conn.our_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()

    async def _head(self, conn, reader, first: bool, raw: list[bytes]):
        """The next request's head, or None when the peer closed an idle connection. The first byte of a request
        after the first may take `idle_timeout`; the whole head then `header_timeout`."""
        import h11
        deadline = None if not first else time.monotonic() + self.limits.header_timeout
        while True:
            ev = conn.next_event()
            if isinstance(ev, h11.Request):
                return ev
            if ev is h11.PAUSED or isinstance(ev, h11.ConnectionClosed):
                return None
            wait = self.limits.idle_timeout if deadline is None else deadline - time.monotonic()
            if wait <= 0:
                raise Reject(408, "request head too slow (--header-timeout)")
            try:
                data = await asyncio.wait_for(reader.read(65536), wait)
            except TimeoutError:
                if deadline is None:
                    return None  # an idle kept-alive connection: closed quietly
                raise Reject(408, "request head too slow (--header-timeout)") from None
            if deadline is None:
                deadline = time.monotonic() + self.limits.header_timeout
            if sum(map(len, raw)) < self.limits.max_header:  # enough to name the request in the log
                raw.append(data[:self.limits.max_header])
            conn.receive_data(data)

    async def _body(self, conn, reader, req) -> bytes:
        """The request body, refused unread when its declared length exceeds `max_body`, and as soon as it does."""
        import h11
        declared = _header(req, b"content-length")
        if declared is not None and int(declared) > self.limits.max_body:
            raise Reject(413, f"body of {int(declared)} bytes is over --max-body ({self.limits.max_body})")
        chunks, size = [], 0
        deadline = time.monotonic() + self.limits.body_timeout
        while True:
            ev = conn.next_event()
            if isinstance(ev, h11.Data):
                size += len(ev.data)
                if size > self.limits.max_body:
                    raise Reject(413, f"body over --max-body ({self.limits.max_body})")
                chunks.append(bytes(ev.data))
            elif isinstance(ev, h11.EndOfMessage):
                return b"".join(chunks)
            elif ev is h11.NEED_DATA:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Reject(408, f"request body not complete within --body-timeout ({self.limits.body_timeout:g} s)")
                try:
                    data = await asyncio.wait_for(reader.read(65536), min(self.limits.idle_timeout, left))
                except TimeoutError:
                    if left <= self.limits.idle_timeout:
                        raise Reject(408, "request body not complete within --body-timeout "
                                          f"({self.limits.body_timeout:g} s)") from None
                    raise Reject(408, f"request body stalled: no byte for --idle-timeout ({self.limits.idle_timeout:g} s)") from None
                if not data:
                    raise ConnectionError("peer closed mid-body")
                conn.receive_data(data)
            else:
                raise ConnectionError(f"unexpected {type(ev).__name__}")

    def reserve(self, n: int) -> int:
        """Reserve `n` bytes of --body-budget for a body about to be read (503 when the budget is spent)."""
        if n > self.limits.max_body:
            raise Reject(413, f"body of {n} bytes is over --max-body ({self.limits.max_body})")
        if self.buffered + n > self.limits.body_budget:
            raise Reject(503, f"the gateway holds {self.buffered} bytes of bodies (--body-budget); try again")
        self.buffered += n
        return n

    async def _forward(self, conn, writer, peer: str, req, path: str, body: bytes) -> int | None:
        """Forward one call and answer it; the SuperLink's status (None: it did not answer)."""
        import httpx
        t0 = time.perf_counter()
        try:
            r = await self.client.post(path, content=body, headers=fr.passed_headers(list(req.headers)))
        except httpx.HTTPError as e:
            await self._reject(conn, writer, peer, req, Reject(502, "the SuperLink did not answer"), len(body),
                               f"upstream error: {type(e).__name__}")
            return None
        ms = 1e3 * (time.perf_counter() - t0)
        headers = [(k, v) for k, v in r.headers.raw if k.lower() not in HOP]
        try:
            await _send(conn, writer, r.status_code, headers, r.content)
        except (ConnectionError, OSError) as e:  # forwarded, answered upstream, the client gone before our answer
            self.log.request(peer, req.method, req.target, r.status_code, len(body), 0, ms,
                             f"client gone before the answer: {type(e).__name__}")
            raise
        self.log.request(peer, req.method, req.target, r.status_code, len(body), len(r.content), ms)
        return r.status_code

    async def _reject(self, conn, writer, peer: str, req, r: Reject, n_in: int = 0, note: str = "") -> None:
        text = f"{r.reason}\n".encode()
        with contextlib.suppress(Exception):  # h11 refuses to answer in some states (e.g. a head never completed)
            await _send(conn, writer, r.status, [(b"content-type", b"text/plain"), (b"connection", b"close")], text)
        method, target = (req.method, req.target) if req is not None else (b"-", b"-")
        self.log.request(peer, method, target, r.status, n_in, len(text), None, note)


def reason_phrase(status: int) -> bytes:
    """The standard reason phrase (flwr prints it: "Client error '404 Not Found'"), empty for an unknown status."""
    try:
        return http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


async def _send(conn, writer, status: int, headers: list, body: bytes) -> None:
    import h11
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    writer.write(conn.send(h11.Response(status_code=status, headers=headers, reason=reason_phrase(status))))
    writer.write(conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
    await writer.drain()


def framing(req) -> fr.Verdict:
    """A Fleet call's body is protobuf with a Content-Length; a Transfer-Encoding (with or without a length beside
    it: the classic request-smuggling pair) is refused rather than interpreted."""
    if _header(req, b"transfer-encoding") is not None:
        return fr.Verdict(400, reason="a Fleet call sends a Content-Length, not a Transfer-Encoding")
    length = _header(req, b"content-length")
    if length is None:
        return fr.Verdict(411, reason="a Fleet call sends its body with a Content-Length")
    if not length.isdigit():
        return fr.Verdict(400, reason="one Content-Length, a number")
    bad = next((k for k, v in req.headers if not visible(k) or not visible(v)), None)
    if bad is not None:
        return fr.Verdict(400, reason=f"header {printable(bad, 40)} holds bytes outside visible ASCII")
    if _header(req, b"content-type") != fr.MEDIA_TYPE:
        return fr.Verdict(415, reason="a Fleet call carries application/protobuf")
    return fr.Verdict(0)


def visible(raw: bytes) -> bool:
    """Only visible ASCII, space and tab: what a Fleet call's headers hold (control bytes and non-ASCII are refused,
    not passed on to the SuperLink)."""
    return all(b == 9 or 32 <= b < 127 for b in raw)


def head_size(req) -> int:
    """The request head's size as sent (request line, each header line, the blank line)."""
    return (len(req.method) + len(req.target) + 12 + sum(len(k) + len(v) + 4 for k, v in req.headers) + 2)


@dataclass(frozen=True)
class Line:
    """A request's method and target as its first line sent them, for a log line when h11 refused to parse it."""
    method: bytes
    target: bytes


def first_line(raw: list[bytes]) -> Line | None:
    data = b"".join(raw)
    if not data.strip():
        return None
    parts = data.split(b"\n", 1)[0].rstrip(b"\r").split(b" ")
    return Line(parts[0] or b"-", parts[1] if len(parts) > 1 else b"-")


def _header(req, name: bytes) -> bytes | None:
    values = [v for k, v in req.headers if k == name]
    return values[0] if len(values) == 1 else (None if not values else b"\0duplicate")


def _peer(writer) -> str:
    info = writer.get_extra_info("peername")
    return f"{info[0]}:{info[1]}" if info else "-"


async def _close(writer) -> None:
    try:
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), 5)
    except Exception:  # noqa: BLE001 - already gone
        pass


def server_tls(certfile: Path, keyfile: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(certfile), str(keyfile))
    return ctx


async def run(host: str, port: int, gateway: Gateway, tls: ssl.SSLContext | None,
              ready: Callable[[], None] = lambda: None) -> None:
    gateway.tls = tls
    server = await asyncio.start_server(gateway.connection, host, port, limit=gateway.limits.max_header)
    ready()
    async with server:
        await server.serve_forever()


def open_log(path: Path | None) -> TextIO:
    return sys.stdout if path is None else open(path, "a", buffering=1)


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


def serve(listen: str, superlink: str, certfile: Path | None, keyfile: Path | None, ca: Path | None,
          limits: Limits = Limits(), host_name: str | None = None, self_registration: bool = False,
          access_log: Path | None = None) -> None:
    """Serve the allowlisted Fleet API of the SuperLink at `superlink` (loopback) on `listen`, with TLS unless no
    certificate is given (an insecure loopback trial). Runs until interrupted."""
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
    flwr = fr.check_flwr()
    scheme = "https" if ca else "http"
    verify = ssl.create_default_context(cafile=str(ca)) if ca else False
    log = AccessLog(open_log(access_log))
    gw = Gateway(f"{scheme}://{up_host}:{up_port}", verify, fr.allowlist(self_registration), limits, log, host_name)
    routes = len(gw.routes)
    banner = (f"Fleet gateway (flwr {flwr}): {scheme}://{host}:{port} -> {routes} Fleet API endpoints of "
              f"{scheme}://{up_host}:{up_port}; max body {limits.max_body} bytes, {limits.max_connections} "
              "connections" + ("; self-registration forwarded" if self_registration else ""))
    try:
        asyncio.run(run(host, port, gw, server_tls(certfile, keyfile) if certfile and keyfile else None,  # all three or none (above)
                        lambda: print(banner, flush=True)))
    except KeyboardInterrupt:
        pass
    except OSError as e:
        raise FedL2PError(f"--listen {listen}: {e.strerror or e}") from None
