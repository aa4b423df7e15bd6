"""The gateway against many prefixes at once (issue 81): strangers share one bounded pool of connections, calls in
flight, new connections a second and log lines, whatever the number of their prefixes; sites keep reserved room, their
calls go to the SuperLink on a pool of their own, and one site's prefix cannot hold all of the sites' room. Loopback
only (Linux routes all of 127/8 there, so 127.x.y.1 are hundreds of /24s), each test bounded in time."""

from __future__ import annotations

import io
import multiprocessing
import os
import re
import socket
import threading
import time
from http.server import ThreadingHTTPServer

import pytest

from fedl2p_cli.flower.admission import Calls, Slots
from tests.gateway_attacks import StandIn, request
from tests.test_gateway import Running, limits, read_all, status
from tests.test_gateway_availability import close_all, connect, one_response, site_call

pytest.importorskip("httpx")
pytest.importorskip("h11")

from fedl2p_cli.flower import gateway as gw  # noqa: E402 - needs httpx and h11


def prefixes(n: int, first: int = 30) -> list[str]:
    """`n` addresses, each in a /24 of its own."""
    return [f"127.{first + i // 250}.{i % 250}.1" for i in range(n)]


# ---- the bookkeeping, without sockets --------------------------------------------------------------------------------

def test_strangers_from_any_number_of_prefixes_hold_at_most_their_share_of_the_slots():
    s = Slots(capacity=16, per_prefix=4, grace=1.0, min_age=0.5)
    site, _, _ = s.admit("10.9.0.1", "10.9.0.0/24", now=0.0)
    s.accepted(site)
    admitted = [c for i in range(500) if (c := s.admit(f"11.{i % 200}.{i // 200}.1", f"11.{i % 200}.0.0/24",
                                                       now=1.0 + i * 1e-3)[0]) is not None]
    assert s.n_strangers == s.stranger_max == 8 and len(admitted) >= 8
    again, victim, why = s.admit("10.9.0.1", "10.9.0.0/24", now=1.6)  # the site reconnecting: room of its own
    assert again is not None and victim is None and not why


def test_a_prefix_never_refused_takes_a_refused_prefixs_slot_however_young():
    """Refused strangers reconnecting at once keep every slot younger than min_age; a newcomer from a prefix not refused
    lately (a new site's first try) takes the oldest refused one's place; a refused prefix's newcomer waits."""
    refused = {f"11.{i}.0.0/24" for i in range(8)}
    s = Slots(capacity=16, per_prefix=4, grace=1.0, min_age=0.5, suspect=refused.__contains__)
    storm = [s.admit(f"11.{i}.0.1", f"11.{i}.0.0/24", now=1.0)[0] for i in range(8)]
    assert None not in storm and s.admit("11.0.0.1", "11.0.0.0/24", now=1.1)[0] is None
    new, victim, _ = s.admit("12.0.0.1", "12.0.0.0/24", now=1.1)
    assert new is not None and victim is storm[0]
    assert s.admit("12.1.0.1", "12.1.0.0/24", now=1.1)[1] is storm[1]


def test_one_sites_prefix_holds_at_most_its_share_of_the_sites_room():
    s = Slots(capacity=16, per_prefix=4, grace=1.0)
    first, _, _ = s.admit("10.9.0.1", "10.9.0.0/24", now=0.0)
    s.accepted(first)
    held = [first]
    for _ in range(20):  # the site opens connection after connection, each with an accepted call
        c, _, why = s.admit("10.9.0.1", "10.9.0.0/24", now=0.0)
        if c is None:
            assert "of the sites' room" in why
            break
        s.accepted(c)
        held.append(c)
    assert len(held) == s.per_site == 2
    other, _, _ = s.admit("10.8.0.1", "10.8.0.0/24", now=0.0)  # a second site: admitted at once
    assert other is not None and not any(c.evicted for c in held)


def test_strangers_calls_are_one_bounded_pool_with_room_for_prefixes_never_refused():
    calls = Calls(16)
    taken = [p for i in range(500) if not calls.take(p := f"10.{i}.0.0/24", refused=True)]
    assert len(taken) == 8 and calls.held == 8  # refused prefixes: half of the pool, whatever their number
    assert calls.take("10.200.0.0/24", refused=False) == ""  # a new site's first call has the other half
    assert calls.take("10.200.0.0/24", refused=False) == ""
    assert "from 10.200.0.0/24" in calls.take("10.200.0.0/24", refused=False)  # an eighth per prefix
    for p in taken:
        calls.give(p, True)
    assert calls.held == 2 and calls.refused == 0


def test_lines_about_strangers_are_bounded_in_all_whatever_the_number_of_prefixes():
    out = io.StringIO()
    log = gw.AccessLog(out, interval=0.2, per_prefix=5, strangers=100)
    for i in range(1000):
        for k in range(3):
            log.stranger(f"10.{i % 250}.{i // 250}.0/24", f"refused {i} {k}")
    time.sleep(0.25)
    log.roll()
    lines = out.getvalue().splitlines()
    assert len(lines) == 101 and "2900 more lines" in lines[-1] and "from 967 prefixes" in lines[-1]


# ---- through the gateway ---------------------------------------------------------------------------------------------

class SlowStrangers(ThreadingHTTPServer):
    """A SuperLink that answers a site's calls (its key) at once and strangers' 401 after `delay` s (a SuperLink busy
    with a flood); it counts the strangers' calls it holds at once."""
    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, delay: float):
        self.held = self.most = 0
        lock = threading.Lock()

        class Handler(StandIn):
            protocol_version = "HTTP/1.1"

            def do_POST(h):  # noqa: N802
                h.rfile.read(int(h.headers.get("content-length", 0)))
                site = h.headers.get("flwr-public-key") == "site"
                if not site:
                    with lock:
                        self.held += 1
                        self.most = max(self.most, self.held)
                    time.sleep(delay)
                    with lock:
                        self.held -= 1
                h.answer(200 if site else 401)

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def pipelined_calls(port: int, sources: list[str], stop, made) -> None:
    """Strangers, one connection per source, each with 20 calls pipelined and its answers read; a connection closed
    is opened again. Run in a process of its own at a lower CPU priority (see reconnect_storm)."""
    os.nice(10)
    raw = request(b"/v1/fleet/get-run") * 20
    socks: dict[str, socket.socket] = {}
    while not stop.is_set():
        for src in sources:
            s = socks.get(src)
            try:
                if s is None:
                    s = socks[src] = connect(port, src)
                    s.sendall(raw)
                    s.setblocking(False)
                    with made.get_lock():
                        made.value += 1
                if s.recv(65536) == b"":
                    raise ConnectionError
            except BlockingIOError:
                pass
            except OSError:
                if s is not None:
                    s.close()
                socks.pop(src, None)
        time.sleep(0.02)
    close_all(socks.values())


def timed_call(s: socket.socket) -> tuple[int, float]:
    t0 = time.monotonic()
    s.sendall(site_call(close=False))
    return status(one_response(s)), time.monotonic() - t0


def new_site(port: int, source: str, tries: int = 10) -> int | None:
    """A site never seen before calls on a fresh connection, retrying a 503 or a refused connection as flwr does
    (here every second); the try that got 200, None: none did."""
    for attempt in range(tries):
        try:
            with connect(port, source) as s:
                s.sendall(site_call())
                if status(read_all(s)) == 200:
                    return attempt
        except OSError:
            pass
        time.sleep(1.0)
    return None


def test_strangers_calls_from_200_prefixes_neither_delay_a_site_nor_keep_a_new_one_out():
    """200 /24s, each under every per-prefix limit, keep calls with a slow SuperLink (2 s each) on pipelined
    connections. Their calls with it are one bounded pool (an eighth of --max-connections), so: the site's calls on
    its kept-alive connection are answered at once (on a connection pool of their own, never queued behind the
    strangers'), and a site never seen before gets in within a few retries. Before issue 81, the strangers' calls held
    every slot and the shared pool to the SuperLink: the site waited 2 s a call and the new site found no slot."""
    up = SlowStrangers(delay=2.0)
    g = Running(up, limits(header_timeout=30, idle_timeout=30))
    fork = multiprocessing.get_context("fork")
    stop, made = fork.Event(), fork.Value("i", 0)
    attack = fork.Process(target=pipelined_calls, args=(g.port, prefixes(200), stop, made), daemon=True)
    try:
        with connect(g.port, "127.200.0.1") as site:
            assert timed_call(site)[0] == 200  # a site of the federation before the flood
            attack.start()
            deadline = time.monotonic() + 15
            while (made.value < 200 or up.held < g_calls()) and time.monotonic() < deadline:
                time.sleep(0.1)
            got = [timed_call(site) for _ in range(8)]
            joined = new_site(g.port, "127.201.0.1")
        assert all(code == 200 for code, _ in got) and max(t for _, t in got) < 1.0, got
        assert joined is not None, g.out.getvalue()[-2000:]
        assert up.most <= g_calls(), up.most  # the SuperLink never held more of the strangers' calls at once
    finally:
        stop.set()
        attack.join(5)
        if attack.is_alive():
            attack.kill()
        g.stop()
        up.shutdown()


def g_calls() -> int:
    """The strangers' calls with the SuperLink at once at the defaults."""
    return gw.Limits().stranger_calls


def test_a_second_site_is_admitted_at_once_while_the_first_holds_its_share():
    """One site (a misconfigured or compromised SuperNode) opens connection after connection, each with a call the
    SuperLink accepts, and keeps them all: it holds at most its share of the sites' room (a quarter of the half of
    --max-connections that strangers cannot take), so a second site's call is answered 200 at once. Before issue 81
    the first site held every slot and the second got 503."""
    up = SlowStrangers(delay=0.0)
    g = Running(up, limits(max_connections=32, header_timeout=30, idle_timeout=30))
    held, refused = [], 0
    try:
        for _ in range(40):
            s = connect(g.port, "127.210.0.1")
            s.sendall(site_call(close=False))
            reply = one_response(s)
            if status(reply) == 200:
                held.append(s)
            else:
                refused += 1
                s.close()
        assert refused and len(held) <= 4 + 1, (len(held), refused)
        t0 = time.monotonic()
        assert new_site(g.port, "127.211.0.1", tries=1) == 0 and time.monotonic() - t0 < 1.0
        for s in held:  # the first site's connections are never closed for the second
            assert timed_call(s)[0] == 200
    finally:
        close_all(held)
        g.stop()
        up.shutdown()


def test_new_connections_from_many_prefixes_are_bounded_together_and_a_new_prefix_keeps_a_way_in(upstream):
    """Each prefix stays under --new-per-second, but strangers together get twice that a second (each new
    connection a TLS handshake), in two buckets: prefixes seen in the last seconds, and the others. A flood from prefixes
    that keep coming back is refused once it has spent its bucket, and a prefix never seen (a new site) still gets in."""
    g = Running(upstream, gw.Limits(new_per_second=2, header_timeout=1, idle_timeout=1))
    try:
        socks = [connect(g.port, src) for src in prefixes(5) for _ in range(4)]  # 5 prefixes x their burst of 4
        with connect(g.port, "127.220.0.1") as s:  # at once, a prefix never seen
            s.sendall(site_call())
            assert status(read_all(s)) == 200
        got = [status(read_all(s)) for s in socks]
        close_all(socks)
        assert got.count(503) >= 5, got  # 5 first connections (of 8), 15 again: 8 of those
        assert "new connections a second from prefixes without an accepted call" in g.out.getvalue()
    finally:
        g.stop()


upstream = __import__("tests.test_gateway", fromlist=["upstream"]).upstream


def test_a_prefix_is_fresh_until_it_comes_back_within_two_seconds():
    from fedl2p_cli.flower.admission import Rate
    r = Rate(20.0)
    assert r.fresh("p", now=0.0) and r.take("p", now=0.0)
    assert not r.fresh("p", now=1.0)  # a storm's prefix, back a second later (its bucket long refilled)
    assert r.take("p", now=1.0) and r.fresh("p", now=3.0)


def test_strangers_calls_forwarded_a_second_are_bounded_together_whatever_the_number_of_prefixes():
    """8 prefixes pipeline 5 calls each (each prefix under every per-prefix limit), all at once: strangers together
    get 2 x --new-per-second calls forwarded a second (a burst of twice that) in each of two buckets (prefixes refused
    lately, and the others), so the rest are answered 503 with Retry-After here, and the SuperLink's work for them
    stays bounded (each forwarded call costs the gateway a call's CPU both ways)."""
    up = SlowStrangers(delay=0.0)  # strangers' calls answered 401
    g = Running(up, gw.Limits(new_per_second=2, header_timeout=5, idle_timeout=5))  # 4 calls/s, a burst of 8
    try:
        t0 = time.monotonic()
        socks = [connect(g.port, src) for src in prefixes(8, first=60)]
        for s in socks:
            s.sendall(request(b"/v1/fleet/get-run") * 4 + request(b"/v1/fleet/get-run", headers={b"connection": b"close"}))
        replies = b"".join(read_all(s) for s in socks)
        bound = 2 * (8 + 4 * (time.monotonic() - t0))
        close_all(socks)
        got = [int(code) for code in re.findall(rb"HTTP/1.1 (\d{3}) ", replies)]
        forwarded = got.count(401)
        assert 8 <= forwarded <= bound and got.count(503) >= 1 and len(got) < 40, got
        assert b"calls a second forwarded for connections without an accepted call" in replies
    finally:
        g.stop()
        up.shutdown()


def test_a_tls_connection_refused_at_accept_is_held_before_its_reset_a_bounded_number_at_once(upstream, tmp_path,
                                                                                              monkeypatch):
    """A refused TLS connection is reset only after HOLD_REFUSED unread (a flood that reconnects at once is slowed to
    one try per hold, at no CPU), and at most HOLD_MAX are held: past that, the reset is at once."""
    pytest.importorskip("cryptography")
    from fedl2p_cli.flower import certs as flower_certs
    monkeypatch.setattr(gw, "HOLD_REFUSED", 30.0)
    monkeypatch.setattr(gw, "HOLD_MAX", 2)
    flower_certs.make(tmp_path, 1, ["127.0.0.1"])
    tls = gw.server_tls(tmp_path / "server.pem", tmp_path / "server.key")
    g = Running(upstream, gw.Limits(new_per_second=1, header_timeout=5), tls=tls)  # a burst of 2 a prefix
    try:
        socks = [connect(g.port, "127.230.0.1") for _ in range(6)]  # 2 admitted, 4 refused
        time.sleep(0.5)
        held = 0
        for s in socks[2:]:
            s.settimeout(0.5)
            try:
                s.sendall(b"\x16\x03\x01\x00\x05hello")  # the start of a ClientHello: a reset connection errs
                s.recv(1)  # or ends
            except TimeoutError:
                held += 1  # still open, unanswered
            except OSError:
                pass
        close_all(socks)
        assert held == 2, held
    finally:
        g.stop()


def test_a_missing_sniffio_is_looked_for_once(monkeypatch):
    """httpcore tries `import sniffio` on every call; where it is not installed the gateway says so once, so that the
    import fails from sys.modules instead of a search of the disk each time."""
    import importlib.util
    import sys
    monkeypatch.setitem(sys.modules, "sniffio", None)
    monkeypatch.delitem(sys.modules, "sniffio")
    missing = importlib.util.find_spec("sniffio") is None
    gw.sniffio_absent()
    assert ("sniffio" in sys.modules and sys.modules["sniffio"] is None) == missing
