"""The Fleet gateway as an attacker on the network sees it (loopback only, bounded in count and time).

A recording upstream stands in for the SuperLink: every test checks what reached it, byte for byte. The attack list
is tests/gateway_attacks.py; the real SuperLink behind the gateway is exercised in tests/test_flower.py."""

from __future__ import annotations

import asyncio
import contextlib
import io
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fedl2p_cli.flower import fleet_routes as fr
from tests.flower_loopback import free_ports
from tests.gateway_attacks import ATTACKS, request

httpx = pytest.importorskip("httpx")
pytest.importorskip("h11")

from fedl2p_cli.flower import gateway as gw  # noqa: E402 - needs httpx and h11


class Upstream(ThreadingHTTPServer):
    """Records each request it receives (method, raw path, headers, body) and answers a fixed protobuf body."""
    daemon_threads = True

    def __init__(self):
        self.seen: list[tuple[str, str, dict, bytes]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(h):  # noqa: N802 - http.server's naming
                body = h.rfile.read(int(h.headers.get("content-length", 0)))
                self.seen.append((h.command, h.path, dict(h.headers), body))
                h.send_response(200)
                h.send_header("content-type", "application/protobuf")
                h.send_header("content-length", "3")
                h.end_headers()
                h.wfile.write(b"\x10\x02\x18")

            do_GET = do_PUT = do_DELETE = do_OPTIONS = do_POST  # noqa: N815

            def log_message(h, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)


class Running:
    """A gateway on a free loopback port in a thread of its own, in front of `upstream`."""

    def __init__(self, upstream: Upstream, limits: gw.Limits, **kw):
        self.port = free_ports(1)[0]
        self.out = io.StringIO()
        up = f"http://127.0.0.1:{upstream.server_address[1]}"
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def main():
            asyncio.set_event_loop(self.loop)
            g = gw.Gateway(up, False, fr.allowlist(kw.get("self_registration", False)), limits,
                           gw.AccessLog(self.out), kw.get("host_name"))
            self.task = self.loop.create_task(gw.run("127.0.0.1", self.port, g, kw.get("tls"), ready.set))
            with contextlib.suppress(asyncio.CancelledError):
                self.loop.run_until_complete(self.task)
            rest = asyncio.all_tasks(self.loop)  # open connections: cancelled and awaited, so none is left pending
            for t in rest:
                t.cancel()
            self.loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
            self.loop.close()

        self.thread = threading.Thread(target=main, daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def stop(self):
        self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(10)

    def send(self, raw: bytes, timeout: float = 5) -> bytes:
        """Send raw bytes on a fresh connection; everything the gateway answers until it closes or goes quiet."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(raw)
            return read_all(s)


def read_all(s: socket.socket) -> bytes:
    chunks = []
    try:
        while data := s.recv(65536):
            chunks.append(data)
    except (TimeoutError, ConnectionResetError):
        pass
    return b"".join(chunks)


def status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else 0


def limits(**kw) -> gw.Limits:
    """The gateway's limits for a test: one loopback prefix makes all its connections, so the per-prefix rate of new
    connections is lifted unless a test is about it."""
    return gw.Limits(**({"new_per_second": 1e6} | kw))


LIMITS = limits(max_body=1 << 20, header_timeout=0.5, idle_timeout=1.0, max_connections=8)


@pytest.fixture(scope="module")
def upstream():
    up = Upstream()
    threading.Thread(target=up.serve_forever, daemon=True).start()
    yield up
    up.shutdown()


@pytest.fixture(scope="module")
def gateway(upstream):
    g = Running(upstream, LIMITS)
    yield g
    g.stop()


@pytest.mark.parametrize("name,raw,allowed", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_is_answered_by_the_gateway_and_never_reaches_the_superlink(gateway, upstream, name, raw, allowed):
    before = len(upstream.seen)
    got = status(gateway.send(raw))
    assert got in allowed, f"{name}: {got}"
    assert len(upstream.seen) == before, f"{name} reached the SuperLink: {upstream.seen[-1][:2]}"


def test_a_fleet_call_is_forwarded_to_the_allowlisted_constant_with_its_auth_headers(gateway, upstream):
    raw = request(b"/v1/fleet/pull-messages", headers={
        b"flwr-public-key": b"cGs=", b"flwr-signature": b"c2ln", b"flwr-timestamp": b"2026-11-25T00:00:00",
        b"x-original-url": b"/v1/control/list-runs", b"x-forwarded-for": b"10.0.0.1", b"cookie": b"a=b"})
    reply = gateway.send(raw)
    assert status(reply) == 200 and reply.endswith(b"\x10\x02\x18")
    method, path, headers, body = upstream.seen[-1]
    assert (method, path, body) == ("POST", "/v1/fleet/pull-messages", b"\x08\x01")
    low = {k.lower(): v for k, v in headers.items()}
    assert low["flwr-public-key"] == "cGs=" and low["flwr-signature"] == "c2ln" and "flwr-timestamp" in low
    assert not {"x-original-url", "x-forwarded-for", "cookie"} & set(low)
    assert "POST /v1/fleet/pull-messages 200 in=2 out=3 upstream_ms=" in gateway.out.getvalue()


def test_every_site_route_passes_and_nothing_else(gateway, upstream):
    for r in fr.SITE_ROUTES:
        assert status(gateway.send(request(f"/v1/fleet/{r}".encode()))) == 200, r
        assert upstream.seen[-1][1] == f"/v1/fleet/{r}"


def test_a_request_pipelined_after_an_allowed_one_is_judged_on_its_own(gateway, upstream):
    before = len(upstream.seen)
    reply = gateway.send(request(b"/v1/fleet/get-run") + request(b"/v1/fleet/../control/list-runs"))
    assert reply.count(b"HTTP/1.1 200") == 1 and b"HTTP/1.1 404" in reply
    assert [p for _, p, _, _ in upstream.seen[before:]] == ["/v1/fleet/get-run"]


def test_an_oversized_body_is_refused_unread(gateway, upstream):
    before = len(upstream.seen)
    head = request(b"/v1/fleet/push-object", body=b"", headers={b"content-length": str(256 << 20).encode()})
    t0 = time.monotonic()
    assert status(gateway.send(head)) == 413 and time.monotonic() - t0 < 3
    chunked = (b"POST /v1/fleet/push-object HTTP/1.1\r\nhost: g\r\ncontent-type: application/protobuf\r\n"
               b"transfer-encoding: chunked\r\n\r\n" + (b"400\r\n" + b"x" * 1024 + b"\r\n") * 2 + b"0\r\n\r\n")
    assert status(gateway.send(chunked)) == 400  # a Fleet call sends a Content-Length
    assert len(upstream.seen) == before


def test_slow_headers_are_cut_off_and_idle_connections_closed(gateway):
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as s:
        s.sendall(b"POST /v1/fleet/get-run HTTP/1.1\r\nhost: g\r\n")  # ... and never the rest
        t0 = time.monotonic()
        reply = read_all(s)
        assert status(reply) == 408 and time.monotonic() - t0 < 3
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as s:
        t0 = time.monotonic()  # a connection that never sends a byte
        reply = read_all(s)
        assert (reply == b"" or status(reply) == 408) and time.monotonic() - t0 < 3


def test_connections_over_the_cap_are_answered_503_when_every_slot_is_a_sites(upstream):
    g = Running(upstream, limits(max_connections=2, header_timeout=2.0, idle_timeout=2.0))
    try:
        held = []
        for _ in range(2):  # each makes a call the SuperLink accepts, and keeps its connection (strangers hold half)
            held.append(s := socket.create_connection(("127.0.0.1", g.port), timeout=5))
            s.sendall(request(b"/v1/fleet/get-run"))
            reply = s.recv(65536)
            while reply.count(b"\x10\x02\x18") == 0:  # the head and the body may come in two reads
                reply += s.recv(65536)
            assert status(reply) == 200
        assert status(g.send(b"")) == 503
        for s in held:
            s.close()
    finally:
        g.stop()


def test_host_name_is_enforced_when_given(upstream):
    g = Running(upstream, LIMITS, host_name="fl.example.org")
    try:
        assert status(g.send(request(b"/v1/fleet/get-run", host=b"evil.example.org"))) == 400
        assert status(g.send(request(b"/v1/fleet/get-run", host=b"fl.example.org:9092"))) == 200
    finally:
        g.stop()


def test_self_registration_is_forwarded_only_when_asked(upstream):
    g = Running(upstream, LIMITS, self_registration=True)
    try:
        assert status(g.send(request(b"/v1/fleet/register-node"))) == 200
        assert upstream.seen[-1][1] == "/v1/fleet/register-node"
        assert status(g.send(request(b"/v1/fleet/../control/register-node"))) == 404
    finally:
        g.stop()


def test_the_gateway_log_has_one_line_per_request_and_no_traceback(gateway):
    gateway.send(request(b"/v1/fleet/..%00"))
    gateway.send(b"\x16\x03\x01 not http at all\r\n\r\n")
    text = gateway.out.getvalue()
    assert "Traceback" not in text and "/v1/fleet/..%00 404" in text
    assert all(line[:4].isdigit() for line in text.splitlines())


def test_decide_matches_bytes_and_forwards_the_constant():
    routes = fr.allowlist(False)
    v = fr.decide(b"POST", b"/v1/fleet/get-run", b"x", routes)
    assert v.status == 0 and v.path == "/v1/fleet/get-run" and v.path is routes[b"/v1/fleet/get-run"]
    assert fr.decide(b"POST", b"/v1/fleet/../control/list-runs", b"x", routes).status == 404
    assert fr.decide(b"POST", b"http://x/v1/fleet/get-run", b"x", routes).status == 400
    assert len(routes) == 10 and len(fr.allowlist(True)) == 12


def test_sites_are_a_closed_list():
    """A node naming a site outside the run's site names is not sampled and is named; two nodes claiming one site
    are one line naming both; without site names, more nodes than sites is refused."""
    from fedl2p_cli.errors import FedL2PError
    from fedl2p_cli.flower.app import Site, federation
    a, b, x = Site(11, 3, "hospital-a"), Site(12, 5, "hospital-b"), Site(99, 7, "stranger")
    said = []
    assert federation([a, x, b], 2, ["hospital-a", "hospital-b"], said.append) == [a, b]
    assert len(said) == 1 and "SuperNode 99 (site 'stranger', client 7) is not one of the run's sites" in said[0]
    for twin in (Site(13, 3, "hospital-c"), Site(13, 8, "hospital-a")):
        with pytest.raises(FedL2PError, match="two SuperNodes claim one site: node 11 .* and node 13"):
            federation([a, b, twin], 2, None, said.append)
    with pytest.raises(FedL2PError, match="3 SuperNodes are connected and the run config has 2 sites"):
        federation([a, b, x], 2, None, said.append)
    assert federation([a, b], 2, None, said.append) == [a, b]


def test_flower_run_drops_only_the_tracebacks_of_its_own_one_line_failures():
    from fedl2p_cli.cli.flower import quiet_own_tracebacks
    ours = ["ERROR :     ServerApp raised an exception\n", "Traceback (most recent call last):\n",
            '  File "x.py", line 1, in main\n', "    serve()\n",
            "fedl2p_cli.errors.FedL2PError: round 2: too few clients answered\n", "run failed: round 2\n"]
    bug = ["Traceback (most recent call last):\n", '  File "y.py", line 2, in f\n', "ZeroDivisionError: division\n"]
    assert list(quiet_own_tracebacks(ours)) == [ours[0], ours[-1]]
    assert list(quiet_own_tracebacks(bug + ["done\n"])) == bug + ["done\n"]


def test_tls_handshakes_that_fail_are_one_log_line_and_tls_calls_pass(upstream, tmp_path):
    pytest.importorskip("cryptography")
    import ssl

    from fedl2p_cli.flower import certs as flower_certs
    flower_certs.make(tmp_path, 1, ["127.0.0.1"])
    g = Running(upstream, LIMITS, tls=gw.server_tls(tmp_path / "server.pem", tmp_path / "server.key"))
    try:
        assert g.send(request(b"/v1/fleet/get-run")) == b""  # plain HTTP on the TLS port
        with socket.create_connection(("127.0.0.1", g.port), timeout=5) as s:  # a client that never says hello
            assert read_all(s) == b""
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        with socket.create_connection(("127.0.0.1", g.port), timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(request(b"/v1/fleet/get-run") + request(b"/v1/fleet/../control/list-runs"))
            reply = read_all(s)
        assert reply.count(b"HTTP/1.1 200") == 1 and b"HTTP/1.1 404" in reply
        lines = g.out.getvalue().splitlines()
        assert sum("TLS handshake failed" in ln for ln in lines) == 2, lines
    finally:
        g.stop()


def test_the_route_check_runs_in_a_child_and_a_changed_flwr_is_one_line(monkeypatch):
    """Importing flwr's Fleet router maps about 90 MB (grpc, numpy, sqlalchemy, pydantic): the gateway reads the
    routes in a child process and never holds it. Routes other than flwr 1.41's, or no answer, stop it in one line."""
    pytest.importorskip("flwr")  # the child reads the installed flwr's routes (the flower extra)
    import subprocess
    import sys
    code = ("import sys; from fedl2p_cli.flower import fleet_routes as fr; fr.check_flwr(); "
            "print('flwr.superlink' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "False", done.stderr
    from fedl2p_cli.errors import FedL2PError
    monkeypatch.setattr(fr, "ROUTES_CODE", "import json; print(json.dumps([['POST', '/api/v0/fleet/new-route']]))")
    with pytest.raises(FedL2PError, match="new: POST /api/v0/fleet/new-route"):
        fr.check_flwr()
    monkeypatch.setattr(fr, "ROUTES_CODE", "raise SystemExit('flwr is broken')")
    with pytest.raises(FedL2PError, match="could not read the installed flwr's Fleet routes: flwr is broken"):
        fr.check_flwr()
