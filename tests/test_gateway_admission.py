"""The gateway's admission rules of issue 72: a site's connection is never evicted or limited for strangers' traffic,
victims are strangers' connections past their grace, limits are per prefix, and a flood costs the log a bounded
number of lines. Loopback only, each test bounded in time."""

from __future__ import annotations

import contextlib
import io
import socket
import time

import pytest

from fedl2p_cli.flower.admission import FEW, Rate, Slots, Window
from tests.gateway_attacks import request
from tests.test_gateway import Running, limits, read_all, status
from tests.test_gateway_availability import SITE, close_all, connect, one_response, site_call, site_send

pytest.importorskip("httpx")
pytest.importorskip("h11")

from fedl2p_cli.flower import gateway as gw  # noqa: E402 - needs httpx and h11

upstream = __import__("tests.test_gateway", fromlist=["upstream"]).upstream


def test_victims_are_strangers_past_their_grace_from_the_prefix_holding_the_most():
    s = Slots(capacity=6, per_prefix=16, grace=1.0, stranger_max=6)
    site, _, _ = s.admit("10.9.0.1", "10.9.0.0/24", now=0.0)
    s.accepted(site)  # a site's connection: not counted, never a victim
    site2, _, _ = s.admit("10.9.0.1", "10.9.0.0/24", now=0.0)  # its second connection, fresh
    crowd = [s.admit("10.0.0.1", "10.0.0.0/24", now=0.1 * i)[0] for i in range(FEW + 2)]
    new, victim, _ = s.admit("10.5.0.1", "10.5.0.0/24", now=0.5)
    assert victim is crowd[0] and new is not None  # the crowd's oldest, though in its grace: it holds more than FEW
    assert s.strangers == {"10.0.0.0/24": FEW + 1, "10.5.0.0/24": 1} and s.newcomers == {"10.9.0.0/24": 1}
    assert site2 is not None and not site2.evicted and not site.evicted


def test_a_sites_prefix_gets_a_slot_in_a_storm_that_keeps_every_slot_fresh():
    """A storm from many prefixes (200 at 1000/s) keeps every slot younger than min_age, so no victim is old enough
    and a freed slot goes to whoever comes first: the storm. A newcomer from a prefix that holds, or lately held, a
    connection with an accepted call (a site reconnecting) takes the oldest stranger's place however young."""
    s = Slots(capacity=4, per_prefix=16, grace=2.0, min_age=0.5, stranger_max=4)
    site, _, _ = s.admit("10.9.0.1", "10.9.0.0/24", now=0.0)
    s.accepted(site)
    storm = [s.admit(f"10.{i}.0.1", f"10.{i}.0.0/24", now=1.0)[0] for i in range(3)]
    new, _, why = s.admit("10.50.0.1", "10.50.0.0/24", now=1.1)
    assert new is None and "slots taken" in why  # a stranger: every slot too young to give way
    new, victim, _ = s.admit("10.9.0.1", "10.9.0.0/24", now=1.1)  # the site's second connection
    assert new is not None and victim is storm[0]
    s.drop(new)
    s.drop(site)  # the site's connection closes: its prefix stays known (a SuperNode reconnects)
    s.admit("10.60.0.1", "10.60.0.0/24", now=1.2)
    s.admit("10.61.0.1", "10.61.0.0/24", now=1.2)
    again, victim, _ = s.admit("10.9.0.1", "10.9.0.0/24", now=1.3)
    assert again is not None and victim is storm[1]
    assert s.known == {"10.9.0.0/24": pytest.approx(time.monotonic(), abs=60)} and not s.sites


def test_a_sites_accepted_connection_does_not_make_its_prefix_the_victim():
    s = Slots(capacity=3, per_prefix=16, grace=1.0)
    site, _, _ = s.admit("10.9.0.1", "10.9.0.0/24", now=0.0)
    s.accepted(site)
    x, _, _ = s.admit("10.0.0.1", "10.0.0.0/24", now=0.0)
    site2, _, _ = s.admit("10.9.0.1", "10.9.0.0/24", now=1.5)  # the site's second connection, fresh
    new, victim, _ = s.admit("10.5.0.1", "10.5.0.0/24", now=2.0)
    assert victim is x and new is not None and not site.evicted and not site2.evicted


def test_a_fresh_connection_keeps_its_grace_and_busy_or_accepted_ones_are_kept():
    s = Slots(capacity=2, per_prefix=16, grace=1.0, min_age=0.3, stranger_max=2)
    a, _, _ = s.admit("10.0.0.1", "10.0.0.0/24", now=0.0)
    b, _, _ = s.admit("10.0.1.1", "10.0.1.0/24", now=0.0)
    assert s.admit("10.0.2.1", "10.0.2.0/24", now=0.2)[0] is None  # both in their grace, and younger than min_age
    s.busy(a, True)  # a call of a is with the SuperLink
    c, victim, _ = s.admit("10.0.2.1", "10.0.2.0/24", now=1.5)
    assert victim is b and c is not None
    s.accepted(a)
    s.busy(a, False)
    assert s.admit("10.0.3.1", "10.0.3.0/24", now=1.7)[0] is None  # c in its grace (and min_age), a a site's
    assert s.admit("10.0.3.1", "10.0.3.0/24", now=3.0)[1] is c
    assert len(s) == 2 and s.top == 1


def test_when_every_slot_is_fresh_the_oldest_past_min_age_goes():
    """A storm from many prefixes keeps every slot in its grace period: the oldest connection of all makes way, once
    it is min_age old (a site's new connection has that long for its first call)."""
    s = Slots(capacity=3, per_prefix=16, grace=2.0, min_age=0.5, stranger_max=3)
    conns = [s.admit(f"10.0.{i}.1", f"10.0.{i}.0/24", now=0.1 * i)[0] for i in range(3)]
    assert s.admit("10.1.0.1", "10.1.0.0/24", now=0.4)[0] is None
    new, victim, _ = s.admit("10.1.0.1", "10.1.0.0/24", now=0.55)
    assert victim is conns[0] and new is not None
    assert s.admit("10.1.1.1", "10.1.1.0/24", now=0.58)[0] is None  # conns[1] is 0.48 s old: not yet past it


def test_rate_and_window_forget_idle_prefixes():
    r = Rate(2.0)
    assert [r.take("p", now=0.0) for _ in range(5)] == [True] * 4 + [False]
    assert r.take("p", now=0.6) and not r.take("p", now=0.6)
    r.sweep(now=10.0)
    assert r.buckets == {}
    w = Window(3, seconds=60)
    for _ in range(3):
        w.add("p", now=0.0)
    assert w.over("p", now=1.0) == 59.0 and w.over("q", now=1.0) == 0.0 and w.over("p", now=61.0) == 0.0
    w.sweep(now=61.0)
    assert w.counts == {}


def test_new_connections_per_prefix_are_limited_and_other_prefixes_served(upstream):
    g = Running(upstream, gw.Limits(new_per_second=5, header_timeout=2, idle_timeout=2))
    try:
        socks = [connect(g.port, "127.0.8.1") for _ in range(20)]  # at once: 10 (the burst) are let in
        got = [status(read_all(s)) for s in socks]
        assert got.count(503) >= 5 and got.count(408) >= 5, got
        close_all(socks)
        assert "over --new-per-second (5)" in g.out.getvalue()
        assert status(site_send(g.port)) == 200
    finally:
        g.stop()


def test_a_sites_connection_gets_503_with_retry_after_never_a_408(upstream):
    """A site's slow body (the gateway under load is one cause) is answered 503, which flwr retries; a stranger's is
    an honest 408."""
    g = Running(upstream, limits(body_timeout=5, idle_timeout=0.5, header_timeout=5))
    try:
        with connect(g.port, SITE) as s:
            s.sendall(site_call(close=False))
            assert status(one_response(s)) == 200
            s.sendall(request(b"/v1/fleet/push-object", body=b"x", headers={b"content-length": b"100"}))
            reply = read_all(s)
        assert status(reply) == 503 and b"retry-after: 1" in reply.lower()
        reply = g.send(request(b"/v1/fleet/push-object", body=b"x", headers={b"content-length": b"100"}))
        assert status(reply) == 408
    finally:
        g.stop()


def test_a_body_below_the_minimum_rate_is_ended(upstream):
    g = Running(upstream, limits(body_timeout=30, idle_timeout=30, header_timeout=5, min_body_rate=4096, grace=0.5))
    try:
        with connect(g.port) as s:
            s.sendall(request(b"/v1/fleet/push-object", body=b"x" * 100, headers={b"content-length": b"100000"}))
            t0 = time.monotonic()
            reply = read_all(s)
        assert status(reply) == 408 and b"--min-body-rate" in reply and time.monotonic() - t0 < 4
    finally:
        g.stop()


def test_a_site_with_an_accepted_connection_keeps_its_fresh_one_in_a_storm(upstream):
    """A site holding an accepted connection opens a second (an overlapping heartbeat and poll): strangers from 40
    prefixes crowding every slot do not make it 'the prefix holding the most', nor close either of its connections."""
    g = Running(upstream, limits(max_connections=8, max_per_peer=16, header_timeout=30, idle_timeout=30, grace=1.0,
                                 min_age=1.0))
    try:
        with connect(g.port, SITE) as first:
            first.sendall(site_call(close=False))
            assert status(one_response(first)) == 200
            time.sleep(1.1)  # past its grace: only its accepted call keeps it
            ok = 0
            for wave in range(4):
                second = connect(g.port, SITE)
                strangers = [connect(g.port, f"127.{10 + wave}.{i}.1") for i in range(10)]
                time.sleep(0.1)
                second.sendall(site_call())
                ok += status(read_all(second)) == 200
                second.close()
                for s in strangers:
                    s.close()
            assert ok == 4
            first.sendall(site_call(close=False))
            assert status(one_response(first)) == 200
    finally:
        g.stop()


def test_an_eviction_during_a_tls_handshake_is_one_line_and_no_error(upstream, tmp_path):
    pytest.importorskip("cryptography")
    from fedl2p_cli.flower import certs as flower_certs
    flower_certs.make(tmp_path, 1, ["127.0.0.1"])
    tls = gw.server_tls(tmp_path / "server.pem", tmp_path / "server.key")
    g = Running(upstream, limits(max_connections=4, max_per_peer=4, grace=0.0, header_timeout=5), tls=tls)
    try:
        hello = [connect(g.port, f"127.0.{20 + i}.1") for i in range(12)]  # each begins a handshake, never ends it
        for s in hello:
            with contextlib.suppress(OSError):  # an evicted one is reset
                s.sendall(b"\x16\x03\x01\x00\x05\x01\x00\x00\x01")  # a truncated ClientHello
            time.sleep(0.02)
        time.sleep(0.3)
        for s in hello:
            s.close()
        time.sleep(0.3)
        text = g.out.getvalue()
        assert "evicted for a newcomer" in text and "gateway error" not in text and "Traceback" not in text
    finally:
        g.stop()


def test_lines_about_strangers_are_summed_up_per_prefix():
    out = io.StringIO()
    log = gw.AccessLog(out, interval=0.2, per_prefix=3)
    for i in range(50):
        log.stranger("10.0.0.0/24", f"10.0.0.1 refused {i}")
    log.line("a site's call")
    time.sleep(0.25)
    log.roll()
    lines = out.getvalue().splitlines()
    assert len(lines) == 5 and "47 more lines" in lines[-1] and "10.0.0.0/24" in lines[-1]


def test_a_tls_refusal_is_a_reset_not_an_end_of_file(upstream, tmp_path):
    """flwr gives up on a connection error that names TLS and retries a reset: a connection the gateway will not
    serve is reset before any TLS byte."""
    pytest.importorskip("cryptography")
    import ssl

    from fedl2p_cli.flower import certs as flower_certs
    flower_certs.make(tmp_path, 1, ["127.0.0.1"])
    tls = gw.server_tls(tmp_path / "server.pem", tmp_path / "server.key")
    g = Running(upstream, gw.Limits(new_per_second=1, header_timeout=5), tls=tls)
    ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    try:
        errors = []
        for _ in range(4):
            try:
                with socket.create_connection(("127.0.0.1", g.port), timeout=5) as raw, \
                        ctx.wrap_socket(raw, server_hostname="127.0.0.1"):
                    pass
            except OSError as e:
                errors.append(e)
        assert errors and all(type(e) is ConnectionResetError for e in errors), errors
    finally:
        g.stop()
