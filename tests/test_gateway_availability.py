"""The gateway's availability and accounting under the attacks of issue 63, on loopback against a recording
upstream: strangers cannot hold a site's slot, a trickled body ends at --body-timeout, buffered bodies stay within
--body-budget, calls refused as unauthenticated are rate-limited per address, and every request is one log line."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import struct
import threading
import time
from http.server import ThreadingHTTPServer

import pytest

from tests import test_gateway
from tests.gateway_attacks import StandIn, request
from tests.test_gateway import Running, limits, read_all, status

pytest.importorskip("httpx")
pytest.importorskip("h11")



class Refusing(ThreadingHTTPServer):
    """A SuperLink that answers every call `refuse` (401: an unauthenticated SuperNode's fate; the real one also
    answers strangers 400 and 412), or 200 for `ok_key`'s calls, after `delay` seconds."""
    daemon_threads = True

    def __init__(self, delay: float = 0.0, ok_key: str | None = None, refuse: int = 401):
        self.calls = 0

        class Handler(StandIn):
            def do_POST(h):  # noqa: N802
                h.rfile.read(int(h.headers.get("content-length", 0)))
                self.calls += 1
                time.sleep(delay)
                ok = ok_key is not None and h.headers.get("flwr-public-key") == ok_key
                h.answer(200 if ok else refuse)

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


SITE = "127.200.0.1"  # a site's address: a /24 of its own, apart from the strangers'


def site_send(port: int, raw: bytes | None = None, source: str = SITE) -> bytes:
    return connect_and_send(port, site_call() if raw is None else raw, source)


@pytest.mark.parametrize("peers", [1, 10])
def test_a_site_gets_in_while_strangers_hold_every_slot(upstream, peers):
    """127 idle connections from one prefix (or from 10) fill every slot; a site's call still gets through at once:
    the oldest connection without an accepted call of the prefix holding the most is closed for it."""
    g = Running(upstream, limits(max_connections=128, max_per_peer=128, header_timeout=30, idle_timeout=30,
                                 grace=0.1))
    try:
        strangers = [s for i in range(peers) for s in hold(g.port, -(-128 // peers), f"127.0.{2 + i}.1")]
        assert len(strangers) >= 120
        t0 = time.monotonic()
        assert status(site_send(g.port)) == 200 and time.monotonic() - t0 < 2
        assert "connection evicted for a newcomer" in g.out.getvalue()
        close_all(strangers)
    finally:
        g.stop()


def test_a_thousand_stranger_connections_never_keep_a_site_out(upstream):
    g = Running(upstream, limits(max_connections=64, max_per_peer=64, header_timeout=30, idle_timeout=30,
                                 grace=0.1))
    try:
        strangers, ok = [], 0
        for i in range(10):  # 1,000 connections in waves, a site's call after each wave
            strangers += hold(g.port, 100, f"127.1.{i}.1")
            ok += status(site_send(g.port)) == 200
        assert ok == 10
        close_all(strangers)
    finally:
        g.stop()


def test_one_prefix_holds_at_most_max_per_peer_and_its_oldest_makes_way(upstream):
    """A /24 holds at most --max-per-peer connections without an accepted call: a newcomer of that prefix is refused
    (503) while they are in their grace period, and takes the place of the prefix's oldest after it (a site behind
    the NAT of a stranger who holds the prefix's share still gets in)."""
    g = Running(upstream, limits(max_connections=16, max_per_peer=3, header_timeout=30, idle_timeout=30, grace=0.5))
    try:
        mine = hold(g.port, 3, "127.0.7.1")
        reply = connect_and_send(g.port, b"", "127.0.7.2")  # another address of the same /24
        assert status(reply) == 503 and b"retry-after: 1" in reply.lower()
        assert "(--max-per-peer)" in g.out.getvalue()
        assert status(site_send(g.port)) == 200  # another prefix is served
        time.sleep(0.6)
        assert status(connect_and_send(g.port, site_call(), "127.0.7.3")) == 200
        assert "127.0.7.1 connection evicted for a newcomer" in g.out.getvalue()
        close_all(mine)
    finally:
        g.stop()


def test_ipv6_addresses_of_one_64_are_one_prefix():
    from fedl2p_cli.flower.admission import prefix
    assert prefix("2001:db8:1:2:aaaa::1") == prefix("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert prefix("2001:db8:1:3::1") != prefix("2001:db8:1:2::1")
    assert prefix("10.1.2.3") == prefix("10.1.2.200") == prefix("::ffff:10.1.2.7") == "10.1.2.0/24"
    assert prefix("10.1.2.3", v4=32) == "10.1.2.3/32" and prefix("2001:db8::1", v6=48) == "2001:db8::/48"


def connect_and_send(port: int, raw: bytes, source: str) -> bytes:
    with connect(port, source) as s:
        s.sendall(raw)
        return read_all(s)


def test_sites_that_made_accepted_calls_are_never_evicted(upstream):
    g = Running(upstream, limits(max_connections=2, max_per_peer=2, header_timeout=30, idle_timeout=30))
    try:
        sites = []
        for _ in range(2):  # one at a time: strangers hold at most half the slots, a site's prefix the rest
            sites += hold(g.port, 1)
            sites[-1].sendall(site_call(close=False))
            assert status(one_response(sites[-1])) == 200
        for source in ("127.0.0.9", "127.0.1.9"):  # the sites' prefix and another: every slot is a site's
            assert status(connect_and_send(g.port, site_call(), source)) == 503
        for s in sites:  # still open: each answers another call
            s.sendall(site_call(close=False))
            assert status(one_response(s)) == 200
        close_all(sites)
    finally:
        g.stop()


@pytest.mark.parametrize("refuse", [401, 400, 412])
def test_refused_calls_are_limited_per_prefix_and_never_a_sites_connection(refuse):
    """Every answer >= 400 the SuperLink gives a connection without an accepted call counts against its prefix (the
    real one answers strangers 400 and 412 as well as 401); over the limit, the prefix's newcomers get 503 with
    Retry-After (which flwr retries; it gives up on a 429), and a site's connection on that prefix (a NAT shared with
    the stranger) keeps being served."""
    up = Refusing(ok_key="site", refuse=refuse)
    g = Running(up, limits(unauth_per_minute=5, header_timeout=5, idle_timeout=5))
    try:
        with connect(g.port, "127.0.3.1") as site:  # the site, behind the stranger's NAT, connected first
            site.sendall(site_call(close=False))
            assert status(one_response(site)) == 200
            got = [connect_and_send(g.port, call(), "127.0.3.9") for _ in range(8)]
            assert [status(r) for r in got] == [refuse] * 5 + [503] * 3 and up.calls == 6  # 503s never reached it
            assert b"retry-after: " in got[-1].lower() and b"--unauth-per-minute" in got[-1]
            for _ in range(3):
                site.sendall(site_call(close=False))
                assert status(one_response(site)) == 200
        assert status(site_send(g.port)) == 200  # another prefix is not limited
    finally:
        g.stop()
        up.shutdown()


def test_a_refusal_counts_when_the_client_leaves_as_soon_as_it_has_it(tmp_path):
    """Over TLS, a stranger that reads the refusal's first bytes and resets still has it counted: the SuperLink's
    verdict is counted when it arrives, not once the client has taken the whole answer."""
    pytest.importorskip("cryptography")
    import ssl

    from fedl2p_cli.flower import certs as flower_certs
    from fedl2p_cli.flower import gateway as gw
    flower_certs.make(tmp_path, 1, ["127.0.0.1"])
    up = Refusing()
    g = Running(up, limits(unauth_per_minute=5, header_timeout=5), tls=gw.server_tls(tmp_path / "server.pem",
                                                                                     tmp_path / "server.key"))
    ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    try:
        for _ in range(12):
            with contextlib.suppress(OSError), ctx.wrap_socket(connect(g.port, "127.0.4.9"),
                                                                server_hostname="127.0.0.1") as s:
                s.sendall(call())
                s.recv(12)  # "HTTP/1.1 401", then gone
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        assert up.calls <= 6, up.calls
    finally:
        g.stop()
        up.shutdown()


def test_a_trickled_body_ends_at_the_body_timeout_with_an_honest_408(upstream):
    g = Running(upstream, limits(body_timeout=1.5, idle_timeout=1.0, header_timeout=5))
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
    g = Running(upstream, limits(body_timeout=30, idle_timeout=0.5, header_timeout=5))
    try:
        reply = g.send(request(b"/v1/fleet/push-object", body=b"x", headers={b"content-length": b"100"}))
        assert status(reply) == 408 and b"--idle-timeout" in reply
    finally:
        g.stop()


def test_a_declared_length_holds_no_budget(upstream):
    """Sixteen heads that each declare a body of --max-body and never send it hold nothing: bytes are taken from
    --body-budget as they arrive, so a site's body still passes (it got 503 for as long as the heads were re-sent)."""
    g = Running(upstream, limits(body_budget=16 * 800, max_body=800, header_timeout=5, idle_timeout=5, body_timeout=5))
    try:
        heads = [connect(g.port, f"127.5.{i}.1") for i in range(16)]  # 16 prefixes: no per-prefix cap in the way
        for s in heads:
            s.sendall(request(b"/v1/fleet/push-object", body=b"", headers={b"content-length": b"800"}))
        time.sleep(0.2)
        reply = site_send(g.port, site_call() + b"")
        big = request(b"/v1/fleet/push-object", body=b"y" * 700,
                      headers={b"flwr-public-key": b"site", b"connection": b"close"})
        assert status(reply) == 200 and status(site_send(g.port, big)) == 200
        close_all(heads)
    finally:
        g.stop()


def test_strangers_bytes_are_capped_per_prefix_and_sites_keep_their_share(upstream):
    """Bytes that strangers' bodies hold count against an eighth of --body-budget per prefix and half of it in all;
    over that, a stranger gets 503 with Retry-After, while a site's connection still has the other half."""
    g = Running(upstream, limits(body_budget=8000, max_body=4000, header_timeout=5, idle_timeout=5, body_timeout=5))
    try:
        with connect(g.port, "127.0.6.1") as s:  # a stranger holding 900 of its prefix's 1000 bytes, still sending
            s.sendall(request(b"/v1/fleet/push-object", body=b"x" * 900, headers={b"content-length": b"4000"}))
            time.sleep(0.3)
            reply = connect_and_send(g.port, call(b"/v1/fleet/push-object", body=b"y" * 300), "127.0.6.2")
            assert status(reply) == 503 and b"an eighth of --body-budget" in reply and b"retry-after" in reply.lower()
            assert status(connect_and_send(g.port, call(b"/v1/fleet/push-object", body=b"y" * 300), "127.0.7.2")) == 200
            with connect(g.port, SITE) as site:
                site.sendall(site_call(close=False))
                assert status(one_response(site)) == 200
                site.sendall(request(b"/v1/fleet/push-object", body=b"z" * 3500, headers={b"flwr-public-key": b"site"}))
                assert status(one_response(site)) == 200  # more than strangers may hold: a site's own share
        time.sleep(0.3)  # the stranger is gone: its bytes are given back
        assert status(connect_and_send(g.port, call(b"/v1/fleet/push-object", body=b"y" * 300), "127.0.6.2")) == 200
    finally:
        g.stop()


def test_budget_shares():
    from fedl2p_cli.flower.admission import Budget, Conn
    b = Budget(800)
    strangers = [Conn(f"10.0.{i}.1", f"10.0.{i}.0/24", 0.0) for i in range(5)]
    site = Conn("10.9.0.1", "10.9.0.0/24", 0.0, authed=True)
    assert b.take(strangers[0], 100) == "" and "an eighth" in b.take(strangers[0], 1)
    for c in strangers[1:4]:
        assert b.take(c, 100) == ""
    assert "half of --body-budget" in b.take(strangers[4], 1)
    assert b.take(site, 400) == "" and "--body-budget" in b.take(site, 1)
    b.give(strangers[0], 100, True)
    assert b.take(site, 100) == "" and b.held == 800 and b.per_prefix.get("10.0.0.0/24") is None


def rst(s: socket.socket) -> None:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def test_every_request_is_one_log_line_even_when_the_client_resets():
    """Requests whose clients reset before the answer (after the SuperLink got them), mid-body and mid-head: one access
    line each, with what happened."""
    up = Refusing(delay=0.3, ok_key="site")
    g = Running(up, limits(header_timeout=5, idle_timeout=5, body_timeout=5))
    try:
        for i in range(4):  # reset while the SuperLink works on the call (4 prefixes: 2 calls each at most)
            s = connect(g.port, f"127.0.{40 + i}.1")
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
    g = Running(upstream, limits(header_timeout=5, idle_timeout=5))
    try:
        reply = g.send(b"POST /v1/fleet/get\x01run\xff HTTP/1.1\r\nhost: g\r\n\r\n")
        assert status(reply) == 400
        assert "POST /v1/fleet/get\\x01run\\xff 400" in g.out.getvalue()
    finally:
        g.stop()


def test_small_points_head_limit_reason_phrase_header_bytes_and_length(upstream):
    g = Running(upstream, limits(header_timeout=5, idle_timeout=5))
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


def served(port: int, tries: int = 3) -> int | None:
    """The retries a site's call needed to be answered 200 (a SuperNode retries a failed connection), None: never."""
    for attempt in range(tries):
        if status(site_send(port)) == 200:
            return attempt
        time.sleep(0.2)
    return None


def test_a_reconnect_storm_of_strangers_leaves_the_site_served(upstream):
    """A site of the federation (one call accepted before the storm, as a SuperNode's polls are) opens a fresh
    connection for each of 10 calls while strangers from one prefix reconnect, holding more connections than there
    are slots, each younger than the grace period: every call is served, at most 3 of them after a retry (the storm
    can take a slot between two of the site's tries). The storm's prefix holds more than a site would (`FEW`), so its
    oldest connection is closed for the site's however young; a gateway that refuses a newcomer when the slots are
    full fails this. A site never seen before, against a storm from many prefixes, is bench/edge_attacks.py's."""
    g = Running(upstream, limits(max_connections=8, max_per_peer=8, header_timeout=1, idle_timeout=1))
    assert status(site_send(g.port)) == 200  # the site, before the storm
    fork = multiprocessing.get_context("fork")
    stop, made = fork.Event(), fork.Value("i", 0)
    storm = fork.Process(target=reconnect_storm, args=(g.port, "127.0.0.6", stop, made), daemon=True)
    storm.start()
    try:
        deadline = time.monotonic() + 10
        while made.value < 100 and time.monotonic() < deadline:  # the storm fills every slot, many times over
            time.sleep(0.05)
        got = [served(g.port) for _ in range(10)]
        assert None not in got and sum(got) <= 3, (got, g.out.getvalue()[-3000:])
        assert made.value >= 100, made.value  # the storm connected meanwhile, many times over the 8 slots
    finally:
        stop.set()
        storm.join(5)
        if storm.is_alive():
            storm.kill()
        g.stop()


def reconnect_storm(port: int, source: str, stop, made, threads: int = 4, pause: float = 0.004,
                    keep: int = 4) -> None:
    """Strangers from `source` connecting and sending half a request head, each of `threads` threads again after
    `pause` seconds (up to 1,000 connections a second), closing its oldest once it holds `keep` (so the storm holds
    more connections than the gateway has slots, each of them young), until `stop`; `made` counts the connections.
    Run in a process of its own at a lower CPU priority: in the test's, its threads would take the GIL from the
    gateway and the upstream running there, and on a busy machine its share of the cores would starve the gateway's;
    a remote attacker's connections cost the gateway its accepts, never its CPU time. The rate stays below what the
    gateway accepts on a busy machine: a flood faster than that fills the kernel's accept queue, where a site's new
    connection is dropped before the gateway sees it (the firewall's to stop: docs/deployment.md), which is not the
    slot policy this storm tests."""
    os.nice(10)

    def loop() -> None:
        held: list[socket.socket] = []
        while not stop.is_set():
            try:
                s = connect(port, source)
                held.append(s)
                s.sendall(b"POST /v1/fleet/get-run HTTP/1.1\r\n")
                with made.get_lock():
                    made.value += 1
            except OSError:
                pass
            while len(held) > keep:
                held.pop(0).close()
            time.sleep(pause)
        for s in held:
            s.close()

    workers = [threading.Thread(target=loop, daemon=True) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()


class Big(ThreadingHTTPServer):
    """A SuperLink whose every answer is `size` bytes (a site pulling a large object)."""
    daemon_threads = True

    def __init__(self, size: int):
        class Handler(StandIn):
            protocol_version = "HTTP/1.1"

            def do_POST(h):  # noqa: N802
                h.rfile.read(int(h.headers.get("content-length", 0)))
                h.send_response(200)
                h.send_header("content-length", str(size))
                h.end_headers()
                with contextlib.suppress(OSError):
                    h.wfile.write(b"\0" * size)

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_a_client_that_does_not_read_its_answer_is_cut_at_the_idle_timeout():
    """A slow read: the answer is relayed a chunk at a time, and a client that takes none of it for --idle-timeout
    is cut (one log line), instead of holding its connection, and the SuperLink's, for ever."""
    big = Big(16 << 20)
    g = Running(big, limits(idle_timeout=1.0))
    try:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", g.port))
        s.sendall(site_call(close=False))  # and never read
        deadline = time.monotonic() + 10
        while "did not read its answer" not in g.out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.1)
        line = next((ln for ln in g.out.getvalue().splitlines() if "did not read" in ln), "")
        assert "POST /v1/fleet/get-run 200" in line and "within --idle-timeout (1 s)" in line, g.out.getvalue()
        s.close()
    finally:
        g.stop()
        big.shutdown()
