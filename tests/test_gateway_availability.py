"""The gateway's availability and accounting under the attacks of issue 63, on loopback against a recording
upstream: strangers cannot hold a site's slot, a trickled body ends at --body-timeout, buffered bodies stay within
--body-budget, calls refused as unauthenticated are rate-limited per address, and every request is one log line."""

from __future__ import annotations

import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests import test_gateway
from tests.gateway_attacks import request
from tests.test_gateway import Running, read_all, status

pytest.importorskip("httpx")
pytest.importorskip("h11")

from fedl2p_cli.flower import gateway as gw  # noqa: E402 - needs httpx and h11


class Refusing(ThreadingHTTPServer):
    """A SuperLink that answers every call 401 (an unauthenticated SuperNode's fate), or 200 for `ok_key`'s calls,
    after `delay` seconds."""
    daemon_threads = True

    def __init__(self, delay: float = 0.0, ok_key: str | None = None):
        self.calls = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(h):  # noqa: N802
                h.rfile.read(int(h.headers.get("content-length", 0)))
                self.calls += 1
                time.sleep(delay)
                ok = ok_key is not None and h.headers.get("flwr-public-key") == ok_key
                h.send_response(200 if ok else 401)
                h.send_header("content-type", "application/protobuf")
                h.send_header("content-length", "1")
                h.end_headers()
                h.wfile.write(b"\x00")

            def log_message(h, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


upstream = test_gateway.upstream  # the recording SuperLink fixture of the attack tests

def site_call(close: bool = True) -> bytes:
    """A registered site's call (the SuperLink accepts its key); by default the last on its connection."""
    return request(b"/v1/fleet/get-run", headers={b"flwr-public-key": b"site"} | ({b"connection": b"close"} if close else {}))


def call(target: bytes = b"/v1/fleet/get-run", **kw) -> bytes:
    """A call that closes its connection after the answer (so reading to the end takes no timeout)."""
    kw["headers"] = {b"connection": b"close"} | kw.get("headers", {})
    return request(target, **kw)


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))


def hold(port: int, n: int, source: str = "127.0.0.1") -> list[socket.socket]:
    out = []
    for _ in range(n):
        try:
            out.append(connect(port, source))
        except OSError:
            break
    time.sleep(0.2)
    return out


def one_response(s: socket.socket) -> bytes:
    """One whole response on a kept-alive connection: its head, then Content-Length bytes of body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    n = int(next(v for k, _, v in (x.partition(b": ") for x in head.split(b"\r\n")) if k.lower() == b"content-length"))
    while len(body) < n:
        body += s.recv(65536)
    return head + b"\r\n\r\n" + body


def close_all(socks):
    for s in socks:
        s.close()


@pytest.mark.parametrize("peers", [1, 10])
def test_a_site_gets_in_while_strangers_hold_every_slot(upstream, peers):
    """127 idle connections from one address (or from 10) fill every slot; a site's call still gets through at once:
    the oldest unauthenticated connection of the address holding the most is closed for it."""
    g = Running(upstream, gw.Limits(max_connections=128, max_per_peer=128, header_timeout=30, idle_timeout=30))
    try:
        strangers = [s for i in range(peers) for s in hold(g.port, -(-128 // peers), f"127.0.0.{2 + i}")]
        assert len(strangers) >= 120
        t0 = time.monotonic()
        assert status(g.send(site_call())) == 200 and time.monotonic() - t0 < 2
        assert "connection closed for a newcomer" in g.out.getvalue()
        close_all(strangers)
    finally:
        g.stop()


def test_a_thousand_stranger_connections_never_keep_a_site_out(upstream):
    g = Running(upstream, gw.Limits(max_connections=64, max_per_peer=64, header_timeout=30, idle_timeout=30))
    try:
        strangers, ok = [], 0
        for i in range(10):  # 1,000 connections in waves, a site's call after each wave
            strangers += hold(g.port, 100, f"127.0.1.{i + 1}")
            ok += status(g.send(site_call())) == 200
        assert ok == 10
        close_all(strangers)
    finally:
        g.stop()


def test_one_address_holds_at_most_max_per_peer(upstream):
    g = Running(upstream, gw.Limits(max_connections=16, max_per_peer=3, header_timeout=30, idle_timeout=30))
    try:
        mine = hold(g.port, 3, "127.0.0.7")
        assert status(connect_and_send(g.port, b"", "127.0.0.7")) == 503
        assert "(--max-per-peer)" in g.out.getvalue()
        assert status(connect_and_send(g.port, site_call(), "127.0.0.8")) == 200  # another address is served
        close_all(mine)
    finally:
        g.stop()


def connect_and_send(port: int, raw: bytes, source: str) -> bytes:
    with connect(port, source) as s:
        s.sendall(raw)
        return read_all(s)


def test_sites_that_made_accepted_calls_are_never_evicted(upstream):
    g = Running(upstream, gw.Limits(max_connections=2, max_per_peer=2, header_timeout=30, idle_timeout=30))
    try:
        sites = hold(g.port, 2)
        for s in sites:
            s.sendall(site_call(close=False))
            assert status(one_response(s)) == 200
        assert status(connect_and_send(g.port, site_call(), "127.0.0.9")) == 503
        for s in sites:  # still open: each answers another call
            s.sendall(site_call(close=False))
            assert status(one_response(s)) == 200
        close_all(sites)
    finally:
        g.stop()


def test_unauthenticated_calls_are_limited_per_address():
    up = Refusing(ok_key="site")
    g = Running(up, gw.Limits(unauth_per_minute=5, header_timeout=5, idle_timeout=5))
    try:
        got = [status(connect_and_send(g.port, call(), "127.0.0.3")) for _ in range(8)]
        assert got == [401] * 5 + [429] * 3 and up.calls == 5  # the 429s never reached the SuperLink
        assert status(connect_and_send(g.port, site_call(), "127.0.0.4")) == 200  # another address is not limited
    finally:
        g.stop()
        up.shutdown()


def test_a_trickled_body_ends_at_the_body_timeout_with_an_honest_408(upstream):
    g = Running(upstream, gw.Limits(body_timeout=1.5, idle_timeout=1.0, header_timeout=5))
    try:
        with connect(g.port) as s:
            s.sendall(request(b"/v1/fleet/push-object", body=b"", headers={b"content-length": b"100"}))
            t0, reply = time.monotonic(), b""
            s.settimeout(0.1)
            while time.monotonic() - t0 < 10 and not reply:
                try:
                    s.sendall(b"x")
                    reply = s.recv(65536)
                except TimeoutError:
                    time.sleep(0.3)  # a byte every 0.4 s: never idle for --idle-timeout
                except OSError:
                    break
            took = time.monotonic() - t0
        assert status(reply) == 408 and b"--body-timeout" in reply and took < 3
    finally:
        g.stop()


def test_a_stalled_body_blames_the_idle_timeout(upstream):
    g = Running(upstream, gw.Limits(body_timeout=30, idle_timeout=0.5, header_timeout=5))
    try:
        reply = g.send(request(b"/v1/fleet/push-object", body=b"x", headers={b"content-length": b"100"}))
        assert status(reply) == 408 and b"--idle-timeout" in reply
    finally:
        g.stop()


def test_buffered_bodies_stay_within_the_budget(upstream):
    g = Running(upstream, gw.Limits(body_budget=1000, max_body=800, header_timeout=5, idle_timeout=5, body_timeout=5))
    try:
        with connect(g.port) as s:  # holds 800 bytes of budget with a body it is still sending
            s.sendall(request(b"/v1/fleet/push-object", body=b"x", headers={b"content-length": b"800"}))
            time.sleep(0.2)
            reply = connect_and_send(g.port, call(b"/v1/fleet/push-object", body=b"y" * 300), "127.0.0.5")
            assert status(reply) == 503 and b"--body-budget" in reply
        time.sleep(0.3)  # the first connection is gone: its reservation is released
        assert status(connect_and_send(g.port, call(b"/v1/fleet/push-object", body=b"y" * 300), "127.0.0.5")) == 200
    finally:
        g.stop()


def rst(s: socket.socket) -> None:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def test_every_request_is_one_log_line_even_when_the_client_resets():
    """Requests whose clients reset before the answer (after the SuperLink got them), mid-body and mid-head: one access
    line each, with what happened."""
    up = Refusing(delay=0.3, ok_key="site")
    g = Running(up, gw.Limits(header_timeout=5, idle_timeout=5, body_timeout=5))
    try:
        for _ in range(4):  # reset while the SuperLink works on the call
            s = connect(g.port)
            s.sendall(site_call())
            time.sleep(0.05)
            rst(s)
        for _ in range(3):  # reset mid-body
            s = connect(g.port)
            s.sendall(request(b"/v1/fleet/push-object", body=b"xx", headers={b"content-length": b"50"}))
            time.sleep(0.05)
            rst(s)
        time.sleep(1.0)
        lines = [x for x in g.out.getvalue().splitlines() if "/v1/fleet/" in x]
        assert up.calls == 4
        assert len(lines) == 7, lines
        assert sum("get-run 200" in x for x in lines) == 4
        assert sum("push-object -" in x and "client gone" in x for x in lines) == 3
    finally:
        g.stop()
        up.shutdown()


def test_a_request_h11_refuses_is_logged_with_its_escaped_target(upstream):
    g = Running(upstream, gw.Limits(header_timeout=5, idle_timeout=5))
    try:
        reply = g.send(b"POST /v1/fleet/get\x01run\xff HTTP/1.1\r\nhost: g\r\n\r\n")
        assert status(reply) == 400
        assert "POST /v1/fleet/get\\x01run\\xff 400" in g.out.getvalue()
    finally:
        g.stop()


def test_small_points_head_limit_reason_phrase_header_bytes_and_length(upstream):
    g = Running(upstream, gw.Limits(header_timeout=5, idle_timeout=5))
    try:
        before = len(upstream.seen)
        big = call(headers={b"x-pad": b"a" * (50 << 10)})
        assert status(g.send(big)) == 431  # a 50 KB head in one read
        assert g.send(call(b"/v1/control/list-runs")).startswith(b"HTTP/1.1 404 Not Found\r\n")
        for value in (b"a\x01b", b"caf\xc3\xa9", b"x\x7f"):
            assert status(g.send(call(headers={b"flwr-public-key": value}))) == 400
        no_length = b"POST /v1/fleet/get-run HTTP/1.1\r\nhost: g\r\ncontent-type: application/protobuf\r\n\r\n"
        assert status(g.send(no_length)) == 411
        assert len(upstream.seen) == before
        assert status(g.send(call(headers={b"flwr-signature": b"a b\tc"}))) == 200
    finally:
        g.stop()


def test_a_reconnect_storm_of_strangers_leaves_the_site_served(upstream):
    g = Running(upstream, gw.Limits(max_connections=8, max_per_peer=8, header_timeout=1, idle_timeout=1))
    stop = threading.Event()

    def storm():
        while not stop.is_set():
            try:
                s = connect(g.port, "127.0.0.6")
                s.sendall(b"POST /v1/fleet/get-run HTTP/1.1\r\n")
                s.close()
            except OSError:
                pass

    threads = [threading.Thread(target=storm, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.3)
        got = [status(connect_and_send(g.port, site_call(), "127.0.0.10")) for _ in range(10)]
        assert got.count(200) == 10
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        g.stop()
