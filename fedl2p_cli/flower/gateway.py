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
  `max_body` bytes (a larger Content-Length is refused unread) and must keep arriving at `min_body_rate`, an idle
  kept-alive connection is closed after `idle_timeout`, and at most `max_connections` are served at once;
- strangers cannot keep a site out (admission.py): a connection on which the SuperLink accepted a call is never
  evicted, rate-limited or refused budget; the other connections are counted per network prefix (connections, new
  connections per second, refused calls per minute, bytes of bodies held) and, whatever the number of prefixes,
  together in one bounded pool (half the connections, an eighth of them as calls in flight, two prefixes' worth of
  new connections a second, half the body budget, a bounded number of log lines); sites' calls go to the SuperLink on
  a connection pool of their own; load is answered 503 with Retry-After (flwr retries it, and gives up on a 429), or,
  on the TLS port before any TLS byte, a reset;
- a body is held once (one buffer, forwarded 64 KiB at a time) and the SuperLink's answer relayed a chunk at a time
  (relay.py); memory stays within the idle size + the body budget + a stated overhead per connection (memory.py);
- every site's request is one access-log line (time, peer, method, target, status, bytes in and out, upstream time);
  lines about strangers are summed up per prefix past a few per interval; the gateway's own failures are one line
  each, never a traceback.

A SuperNode still authenticates to the SuperLink itself: its signed headers pass through unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import importlib.util
import ipaddress
import socket
import ssl
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from ..errors import FedL2PError
from . import fleet_routes as fr
from . import memory
from .admission import Budget, Calls, Conn, Rate, Slots, Window, prefix

if TYPE_CHECKING:
    from .relay import Body

MiB = 1 << 20
SEND_TIMEOUT = 10.0  # seconds a client has to take one of the gateway's own (short) answers
TURNED, TURNED_FOR = 4, 10.0  # a prefix the gateway refused this often for load in this many seconds: a flood's
# a TLS connection refused at accept is held this long, unread, before its reset, at most HOLD_MAX at once: a client
# that reconnects as soon as it is reset (a flood's) then costs an accept and a reset a second, not as fast as it goes
HOLD_REFUSED, HOLD_MAX = 1.0, 1024
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
    max_per_peer: int = 16          # connections without an accepted call one prefix may hold
    unauth_per_minute: int = 30     # answers >= 400 per prefix and minute to connections without an accepted call
    new_per_second: float = 20.0    # new connections (so TLS handshakes) per prefix and second
    prefix_v4: int = 24             # the network an IPv4 address is counted in
    prefix_v6: int = 64             # ... and an IPv6 address (one host commonly holds a whole /64)
    min_body_rate: int = 16 * 1024  # bytes/s a body must average once its first `grace` seconds are over
    grace: float = 2.0              # a new connection is not closed for a newcomer before this (see admission.Slots)...
    min_age: float = 0.5            # ... unless every slot is that fresh: then the oldest, past this
    log_interval: float = 10.0      # lines about strangers are summed up per prefix over this

    @property
    def stranger_calls(self) -> int:
        """Calls of connections without an accepted call with the SuperLink at once, all prefixes together."""
        return max(4, self.max_connections // 8)

    @property
    def strangers_new_per_second(self) -> float:
        """New connections a second from prefixes that are not sites', all together (each a TLS handshake)."""
        return 2 * self.new_per_second  # at 5 x, a site's p50 under 500 /24s of refused calls was 1.5-2 x as long

    @property
    def strangers_calls_per_second(self) -> float:
        """Calls of connections without an accepted call forwarded to the SuperLink a second, all prefixes together, in
        each of two buckets (prefixes refused lately, and the others): each costs the gateway a call's CPU both ways."""
        return 2 * self.new_per_second


class Reject(Exception):
    """A request answered by the gateway itself; the connection is closed after the answer. `retry`: seconds for a
    Retry-After header (load answers are 503, which flwr retries)."""

    def __init__(self, status: int, reason: str, retry: int | None = None):
        super().__init__(reason)
        self.status, self.reason, self.retry = status, reason, retry


class AccessLog:
    """One line per request and per gateway failure, flushed at once (an operator tails it). Lines about connections
    without an accepted call (refusals, rejected requests, failed handshakes, evictions) are written for the first
    `per_prefix` of each prefix in each `interval`, and at most `strangers` of them in all; the rest are counted and
    summed up in one line per interval (the prefixes with the most named): a flood from any number of prefixes costs
    the log a bounded number of lines per interval, while every site's call still gets its own line."""

    def __init__(self, out: TextIO, interval: float = 10.0, per_prefix: int = 5, strangers: int = 100):
        self.out, self.interval, self.per_prefix, self.strangers = out, interval, per_prefix, strangers
        self.said: dict[str, int] = {}
        self.held: dict[str, int] = {}
        self.n_said = 0
        self.since = time.monotonic()

    def line(self, text: str) -> None:
        self.out.write(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {text}\n")
        self.out.flush()

    def stranger(self, pfx: str, text: str) -> None:
        self.roll()
        n = self.said.get(pfx, 0)
        if n < self.per_prefix and self.n_said < self.strangers:
            self.said[pfx] = n + 1
            self.n_said += 1
            self.line(text)
        else:
            self.held[pfx] = self.held.get(pfx, 0) + 1

    def roll(self, force: bool = False) -> None:
        """At the end of an interval: one line for the lines held back, naming the three prefixes with the most."""
        now = time.monotonic()
        if not force and now - self.since < self.interval:
            return
        if self.held:
            top = sorted(self.held.items(), key=lambda kv: -kv[1])[:3]
            self.line(f"{sum(self.held.values())} more lines about connections without an accepted call from "
                      f"{len(self.held)} prefixes in {now - self.since:.0f} s (refused, rejected, evicted or failed "
                      "handshakes) not written one by one; most from " + ", ".join(f"{p} ({n})" for p, n in top))
        self.said.clear()
        self.held.clear()
        self.n_said = 0
        self.since = now

    def request(self, peer: str, method: bytes, target: bytes, status: int | str, n_in: int, n_out: int,
                upstream_ms: float | None, note: str = "", stranger: str | None = None) -> None:
        up = f"{upstream_ms:.1f}" if upstream_ms is not None else "-"
        text = (f"{peer} {printable(method, 16)} {printable(target, 200)} {status} in={n_in} out={n_out} "
                f"upstream_ms={up}" + (f" {note}" if note else ""))
        self.stranger(stranger, text) if stranger is not None else self.line(text)


def printable(raw: bytes, limit: int) -> str:
    """Bytes as an operator can read them in one log line: non-printables escaped, long ones cut."""
    text = repr(raw[:limit])[2:-1]
    return text + ("..." if len(raw) > limit else "")


class Hold:
    """The body-budget bytes one request holds, taken as they arrive and given back once it is answered."""

    def __init__(self, budget: Budget, c: Conn):
        self.budget, self.c, self.as_stranger, self.as_site = budget, c, 0, 0

    def take(self, n: int) -> None:
        why = self.budget.take(self.c, n)
        if why:
            raise Reject(503, f"{why}; try again", retry=1)
        if self.c.authed:
            self.as_site += n
        else:
            self.as_stranger += n

    def release(self) -> None:
        self.budget.give(self.c, self.as_stranger, True)
        self.budget.give(self.c, self.as_site, False)
        self.as_stranger = self.as_site = 0


class Gateway:
    """Serves connections: parse heads with h11, decide on the raw target, forward allowlisted calls with httpx."""

    def __init__(self, upstream: str, verify: ssl.SSLContext | bool, routes: dict[bytes, str], limits: Limits,
                 log: AccessLog, host_name: str | None = None):
        import httpx
        self.routes, self.limits, self.log, self.host_name = routes, limits, log, host_name
        pool = limits.max_connections  # a site's call never waits for a strangers' call to free a pooled connection:
        self.client = httpx.AsyncClient(base_url=upstream, verify=verify, timeout=limits.upstream_timeout,
                                        limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool))
        self.strangers_client = httpx.AsyncClient(  # ... strangers' calls have a pool of their own, as many as they
            base_url=upstream, verify=verify, timeout=limits.upstream_timeout,  # may have with the SuperLink (`calls`)
            limits=httpx.Limits(max_connections=limits.stranger_calls, max_keepalive_connections=limits.stranger_calls))
        self.refused = Window(limits.unauth_per_minute)  # answers >= 400 to connections without an accepted call
        self.turned = Window(TURNED, seconds=TURNED_FOR)  # the gateway's own refusals for load, per prefix
        self.slots = Slots(limits.max_connections, limits.max_per_peer, limits.grace, limits.min_age,
                           suspect=self.suspect)
        self.calls = Calls(limits.stranger_calls)
        self.new = Rate(limits.new_per_second)
        self.strangers_new = Rate(limits.strangers_new_per_second)  # two buckets: prefixes seen lately, and the others
        self.strangers_calls = Rate(limits.strangers_calls_per_second)  # two: prefixes refused lately, and the others
        self.budget = Budget(limits.body_budget)
        self.tls: ssl.SSLContext | None = None  # set by `run`: the handshake happens here, so it is bounded and logged
        self.tls_closed = 0  # TLS connections closed since the last collection of their buffers
        self.holding = 0  # refused connections held before their reset (HOLD_REFUSED)

    @property
    def active(self) -> int:
        return len(self.slots)

    @property
    def buffered(self) -> int:
        return self.budget.held

    def prefix(self, ip: str) -> str:
        return prefix(ip, self.limits.prefix_v4, self.limits.prefix_v6)

    def suspect(self, pfx: str) -> bool:
        """Whether `pfx` was refused lately by the SuperLink, or `TURNED` times by the gateway for load: a flood's
        prefixes, which try again at once, soon are; a new site's first few tries are not, so they have room of their
        own (admission.Calls, Slots._for_clean)."""
        return self.refused.seen(pfx) or self.turned.over(pfx) > 0

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer(writer)
        ip = peer.rpartition(":")[0] or peer
        pfx = self.prefix(ip)
        fresh = self.new.fresh(pfx)
        if not self.new.take(pfx):
            return await self._refuse(writer, peer, pfx, f"over --new-per-second ({self.limits.new_per_second:g}) "
                                                         f"new connections from {pfx}")
        if not self.slots.is_site(pfx) and not self.strangers_new.take("first" if fresh else "again"):
            return await self._refuse(writer, peer, pfx, f"over {self.limits.strangers_new_per_second:g} new "
                                      "connections a second from prefixes without an accepted call (2 x "
                                      "--new-per-second)" + ("" if fresh else " seen in the last seconds"))
        c, victim, why = self.slots.admit(ip, pfx)
        if victim is not None:
            self._evict(victim)
        if c is None:
            return await self._refuse(writer, peer, pfx, why)
        c.handle = asyncio.current_task()
        try:
            if self.tls is not None and not await self._handshake(writer, peer, pfx):
                return
            await self._serve(reader, writer, peer, c)
        except asyncio.CancelledError:
            if not c.evicted:  # the gateway stopping: not ours to swallow
                raise
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, TimeoutError):
            pass  # the peer went away or stalled: nothing to answer
        except Exception as e:  # noqa: BLE001 - the gateway's own failure: one line, the connection closed
            self.log.line(f"{peer} gateway error: {type(e).__name__}: {e}")
        finally:
            self.slots.drop(c)
            if self.tls is not None:
                self._tls_gone()
            if c.evicted:
                _reset(writer)
            else:
                await _close(writer)

    def _tls_gone(self) -> None:
        """A TLS connection closed: its buffers are freed by the next collection (housekeeping's, once a second), or
        now when `memory.COLLECT_EVERY` have closed since the last (a flood of handshakes)."""
        self.tls_closed += 1
        if self.tls_closed >= memory.COLLECT_EVERY:
            self.tls_closed = 0
            memory.release()

    def _evict(self, victim: Conn) -> None:
        """Close a stranger's connection for a newcomer: its handler is cancelled and the connection reset."""
        self.log.stranger(victim.prefix, f"{victim.ip} connection evicted for a newcomer: no accepted call on it, "
                                         f"open {time.monotonic() - victim.opened:.1f} s")
        if victim.handle is not None:
            victim.handle.cancel()

    async def _refuse(self, writer, peer: str, pfx: str, why: str) -> None:
        """A connection not admitted: a 503 with Retry-After (plain HTTP), or a reset before any TLS byte (flwr gives up
        on an error that names TLS, and retries a reset), held `HOLD_REFUSED` unread first (no CPU: its reads paused)."""
        self.log.stranger(pfx, f"{peer} refused: {why}")
        self.turned.add(pfx)
        if self.tls is not None:
            if self.holding >= HOLD_MAX:
                return _reset(writer)
            self.holding += 1
            writer.transport.pause_reading()
            asyncio.get_running_loop().call_later(HOLD_REFUSED, self._release, writer)
            return None
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-length: 0\r\n"
                     b"connection: close\r\n\r\n")
        await _close(writer)

    def _release(self, writer) -> None:
        self.holding -= 1
        _reset(writer)

    async def _handshake(self, writer, peer: str, pfx: str) -> bool:
        """TLS on the accepted connection, within `header_timeout`; a failure (plain HTTP on the TLS port, a client
        that never speaks, a bad client hello) is one log line (summed up per prefix under a flood)."""
        try:
            await writer.start_tls(self.tls, ssl_handshake_timeout=self.limits.header_timeout)
            memory.limit_tls_input(writer)
            return True
        except (ssl.SSLError, ConnectionError, TimeoutError, OSError) as e:
            why = getattr(e, "reason", None)
            self.log.stranger(pfx, f"{peer} TLS handshake failed: {type(e).__name__}" + (f": {why}" if why else ""))
            return False

    async def _serve(self, reader, writer, peer: str, c: Conn) -> None:
        """Requests on one connection, in turn: the head (parsed by a fresh h11 connection each), the decision (before
        a byte of the body is read), the body (read here, into one buffer), the forward. Anything answered here closes
        the connection."""
        import h11
        pending, first = b"", True  # bytes after the previous request's body; the first request of the connection
        while True:
            conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_header)
            if pending:  # (receive_data(b"") would mean the peer closed)
                conn.receive_data(pending)
            raw: list[bytes] = [pending[:self.limits.max_header]] if pending else []
            req, hold = None, Hold(self.budget, c)
            try:
                req = await self._head(conn, reader, first, raw)
                if req is None:
                    return
                first = False
                path, n = self._decide(req, c)
                body, pending = await self._body(reader, conn.trailing_data[0], n, hold)
                lane = self._call_slot(c)
            except h11.RemoteProtocolError as e:
                hold.release()
                return await self._reject(conn, writer, peer, req or first_line(raw), c,
                                          Reject(e.error_status_hint, f"bad request: {e}"))
            except Reject as r:
                hold.release()
                return await self._reject(conn, writer, peer, req or first_line(raw), c, r)
            except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, OSError) as e:
                hold.release()
                line = req or first_line(raw)
                if line is not None:  # a request begun, then the peer went away: its line
                    self.log.request(peer, line.method, line.target, "-", 0, 0, None,
                                     f"client gone: {type(e).__name__}", None if c.authed else c.prefix)
                raise
            self.slots.busy(c, True)
            try:
                await self._forward(conn, writer, peer, req, path, body, c)
            finally:
                del body  # freed with its budget, not held while the connection waits for its next request
                hold.release()
                self.slots.busy(c, False)
                if lane is not None:
                    self.calls.give(*lane)
            if conn.our_state is h11.MUST_CLOSE:
                return

    def _decide(self, req, c: Conn) -> tuple[str, int]:
        """The path to forward to and the body's length, or the Reject that answers the request."""
        if head_size(req) > self.limits.max_header:  # a whole head in one read escapes h11's own bound
            raise Reject(431, f"request head over {self.limits.max_header} bytes")
        verdict = fr.decide(req.method, req.target, _header(req, b"host"), self.routes, self.host_name)
        for v in (verdict, framing(req)):
            if v.status:
                raise Reject(v.status, v.reason)
        wait = 0.0 if c.authed else self.refused.over(c.prefix)  # a site's connection is never limited
        if wait:
            raise Reject(503, f"{self.limits.unauth_per_minute} calls from {c.prefix} refused in a minute "
                              "(--unauth-per-minute); try again later", retry=int(wait) + 1)
        n = int(_header(req, b"content-length") or 0)
        if n > self.limits.max_body:
            raise Reject(413, f"body of {n} bytes is over --max-body ({self.limits.max_body})")
        return verdict.path, n

    def _call_slot(self, c: Conn) -> tuple[str, bool] | None:
        """A stranger's call takes a slot of the strangers' calls with the SuperLink (what to give back), or is
        answered 503 with Retry-After; a site's call (its connection's, or its prefix's) takes none."""
        if c.authed or c.site_room:
            return None
        refused = self.suspect(c.prefix)
        why = self.calls.take(c.prefix, refused)
        if not why and not self.strangers_calls.take("refused" if refused else "clean"):
            self.calls.give(c.prefix, refused)
            why = (f"over {self.limits.strangers_calls_per_second:g} calls a second forwarded for connections without "
                   "an accepted call (2 x --new-per-second)" + (" from prefixes refused lately" if refused else ""))
        if why:
            self.turned.add(c.prefix)
            raise Reject(503, f"{why}; try again", retry=1)
        return c.prefix, refused

    def _account(self, c: Conn, status: int | None) -> None:
        """An answer the SuperLink gave: an accepted call makes the connection a site's; a refusal (>= 400) to a
        connection without one counts against its prefix (401, 403, but also 400 and 412: what strangers get)."""
        if status is None:
            return
        if status < 400:
            self.slots.accepted(c)
        elif not c.authed:
            self.refused.add(c.prefix)

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
            if raw and deadline is None:  # pipelined bytes of the next request already here
                deadline = time.monotonic() + self.limits.header_timeout
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

    async def _body(self, reader, leftover: bytes, n: int, hold: Hold) -> tuple[Body, bytes]:
        """The body's `n` bytes, read into one buffer (relay.Body), each read's bytes taken from the budget as they
        arrive; and the bytes after it (a pipelined request). It must arrive within `body_timeout`, with no gap of
        `idle_timeout`, and at `min_body_rate` on average once `grace` seconds are over."""
        from .relay import Body
        lim = self.limits
        body = Body(n)
        first, pending = leftover[:n], leftover[n:]
        if first:
            hold.take(len(first))
            body.add(first)
        t0 = last = time.monotonic()
        while len(body) < n:
            now = time.monotonic()
            if now - t0 >= lim.body_timeout:
                raise Reject(408, f"request body not complete within --body-timeout ({lim.body_timeout:g} s)")
            if now - last >= lim.idle_timeout:
                raise Reject(408, f"request body stalled: no byte for --idle-timeout ({lim.idle_timeout:g} s)")
            if now - t0 > lim.grace and len(body) < lim.min_body_rate * (now - t0 - lim.grace):
                raise Reject(408, f"request body slower than --min-body-rate ({lim.min_body_rate >> 10} KiB/s)")
            wait = min(lim.body_timeout - (now - t0), lim.idle_timeout - (now - last), 1.0)
            try:
                data = await asyncio.wait_for(reader.read(min(memory.READ, n - len(body))), wait)
            except TimeoutError:
                continue
            if not data:
                raise ConnectionError("peer closed mid-body")
            hold.take(len(data))
            body.add(data)
            last = time.monotonic()
        return body, pending

    async def _forward(self, conn, writer, peer: str, req, path: str, body: Body, c: Conn) -> int | None:
        """Forward one call and answer it; the SuperLink's status (None: it did not answer)."""
        import httpx

        from . import relay
        t0 = time.perf_counter()
        headers = [*fr.passed_headers(list(req.headers)), (b"content-length", str(len(body)).encode())]
        client = self.client if c.authed or c.site_room else self.strangers_client
        request = client.build_request("POST", path, headers=headers)
        request.stream = stream = relay.Chunks(body)  # views of the one buffer, a chunk at a time: never copied whole
        try:
            r = await client.send(request, stream=True)
        except httpx.HTTPError as e:
            await self._reject(conn, writer, peer, req, c, Reject(502, "the SuperLink did not answer", retry=1),
                               len(body), f"upstream error: {type(e).__name__}")
            return None
        finally:
            stream.drop()
        try:
            return await self._answer(conn, writer, peer, req, c, r, len(body), t0)
        finally:
            await r.aclose()

    async def _answer(self, conn, writer, peer: str, req, c: Conn, r, n_in: int, t0: float) -> int:
        """Relay the SuperLink's answer `r` to the client a chunk at a time (never held whole); its status. A client
        that does not read it within --idle-timeout, or leaves, is cut (ConnectionError), after its log line."""
        import h11
        import httpx

        from . import relay
        ms = 1e3 * (time.perf_counter() - t0)
        quiet = None if c.authed or r.status_code < 400 else c.prefix
        self._account(c, r.status_code)  # the SuperLink's verdict counts, whether or not the client reads it
        out = [(k, v) for k, v in r.headers.raw if k.lower() not in HOP]
        n = relay.declared_length(r.headers.raw)
        if n is not None:
            out.append((b"content-length", str(n).encode()))
        # a stranger's answer holds one of the strangers' calls until it is read: a slow reader is cut sooner
        sent, wait = 0, self.limits.idle_timeout if c.authed else min(self.limits.idle_timeout, SEND_TIMEOUT)
        try:
            head = conn.send(h11.Response(status_code=r.status_code, headers=out, reason=reason_phrase(r.status_code)))
            sent = await relay.relay_body(conn, writer, head, r.aiter_bytes(relay.CHUNK), wait)
        except TimeoutError:
            note = f"the client did not read its answer within --idle-timeout ({wait:g} s)"
        except (ConnectionError, OSError) as e:  # forwarded, answered upstream, the client gone before our answer
            note = f"client gone before the answer: {type(e).__name__}"
        except httpx.HTTPError as e:
            note = f"the SuperLink's answer broke off: {type(e).__name__}"
        else:
            self.log.request(peer, req.method, req.target, r.status_code, n_in, sent, ms, "", quiet)
            return r.status_code
        self.log.request(peer, req.method, req.target, r.status_code, n_in, sent, ms, note, quiet)
        raise ConnectionError(note)

    async def _reject(self, conn, writer, peer: str, req, c: Conn, r: Reject, n_in: int = 0, note: str = "") -> None:
        """Answer a request here. A site's connection never gets a 4xx for load or slowness: those become 503 with
        Retry-After, which flwr retries (it gives up on any other 4xx)."""
        status, retry = r.status, r.retry
        if c.authed and status in (408, 429):
            status, retry = 503, retry or 1
        text = f"{r.reason}\n".encode()
        headers = [(b"content-type", b"text/plain"), (b"connection", b"close")]
        if retry is not None:
            headers.append((b"retry-after", str(retry).encode()))
        with contextlib.suppress(Exception):  # h11 refuses to answer in some states (e.g. a head never completed)
            await _send(conn, writer, status, headers, text)
        method, target = (req.method, req.target) if req is not None else (b"-", b"-")
        self.log.request(peer, method, target, status, n_in, len(text), None, note, None if c.authed else c.prefix)

    async def housekeeping(self) -> None:
        """Once a second: collect the closed TLS connections' buffers (asyncio's SSL protocol keeps its buffers in
        reference cycles that only the cyclic collector frees) and hand the memory back; once per log interval: sum
        up the held-back log lines and forget idle prefixes."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            if self.tls_closed:
                self.tls_closed = 0
                memory.release()
            if time.monotonic() - last >= self.limits.log_interval:
                last = time.monotonic()
                self.log.roll()
                self.new.sweep()
                self.refused.sweep()
                self.turned.sweep()


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
    await asyncio.wait_for(writer.drain(), SEND_TIMEOUT)


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


def _reset(writer) -> None:
    """Close at once with a TCP reset (SO_LINGER 0): nothing more is sent, and a TLS client sees a reset, which flwr
    retries, rather than an end of file inside a handshake, which it does not."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError, AttributeError):
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


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


def sniffio_absent() -> None:
    """httpcore tries `import sniffio` on every call it makes and uses asyncio when that fails; a missing module is
    looked for on disk every time (5 % of the gateway's CPU under a flood of strangers' calls). Said once instead."""
    if "sniffio" not in sys.modules and importlib.util.find_spec("sniffio") is None:
        sys.modules["sniffio"] = None  # type: ignore[assignment]  # `import sniffio` now fails at once


async def run(host: str, port: int, gateway: Gateway, tls: ssl.SSLContext | None,
              ready: Callable[[], None] = lambda: None) -> None:
    gateway.tls = tls
    memory.small_tls_buffers()
    sniffio_absent()
    server = await asyncio.start_server(gateway.connection, host, port, limit=gateway.limits.max_header,
                                        backlog=1024)  # a burst of connections waits in the queue, not refused
    chores = asyncio.ensure_future(gateway.housekeeping())
    ready()
    try:
        async with server:
            await server.serve_forever()
    finally:
        chores.cancel()


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
