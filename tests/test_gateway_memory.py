"""The gateway's memory (issue 72): its resident size stays within its idle size + --body-budget + connections x the
stated per-connection overhead (fedl2p_cli/flower/memory.py OVERHEAD_KIB), while sites send bodies that fill the
budget on connections held open beside handshakes never finished; and after a flood of TLS handshakes ends, the
handshakes' buffers are freed. The gateway runs in a process of its own (its /proc RSS is what is measured), with
TLS, on loopback; each phase is bounded in time. Not a speed test: nothing here is timed but the bounds."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.flower_loopback import REPO, free_ports, wait_for_port
from tests.gateway_attacks import StandIn, request

pytest.importorskip("httpx")
pytest.importorskip("h11")
pytest.importorskip("cryptography")
if not Path("/proc/self/status").exists():
    pytest.skip("reads resident memory from /proc (Linux)", allow_module_level=True)

from fedl2p_cli.flower.memory import OVERHEAD_KIB  # noqa: E402

MiB = 1 << 20
BUDGET, MAX_BODY = 16 * MiB, 2 * MiB
SITES, HANDSHAKING = 24, 24
GATEWAY = """
import asyncio, json, ssl, sys
from pathlib import Path
from fedl2p_cli.flower import gateway as g, fleet_routes as fr
port, up, certs, limits = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4])
verify = ssl.create_default_context(cafile=str(certs / "ca.crt"))
gw = g.Gateway(f"https://127.0.0.1:{up}", verify, fr.allowlist(False), g.Limits(**limits), g.AccessLog(sys.stdout))
asyncio.run(g.run("127.0.0.1", port, gw, g.server_tls(certs / "server.pem", certs / "server.key")))
"""


class SlowUpstream(ThreadingHTTPServer):
    """Reads a body of over 1 KiB only after `delay` s (so that the bodies on their way to it are held at once, in
    the gateway's buffers and whatever copies it makes to send them), then answers a site's call 200, others 401."""
    daemon_threads = True

    def __init__(self, delay: float, certs: Path):
        class Handler(StandIn):
            protocol_version = "HTTP/1.1"

            def do_POST(h):  # noqa: N802
                n = int(h.headers.get("content-length", 0))
                if n > 1024:
                    time.sleep(delay)
                h.rfile.read(n)
                ok = h.headers.get("flwr-public-key") == "site"
                h.answer(200 if ok else 401)

        super().__init__(("127.0.0.1", 0), Handler)
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)  # TLS, as the SuperLink behind a deployment's gateway
        tls.load_cert_chain(str(certs / "server.pem"), str(certs / "server.key"))
        self.socket = tls.wrap_socket(self.socket, server_side=True)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def rss_mib(pid: int) -> float:
    for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1]) / 1024
    return 0.0


class Peak(threading.Thread):
    """The process's peak RSS, sampled every 5 ms until stopped."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, 0.0, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, rss_mib(self.pid))
            time.sleep(0.005)

    def stop(self) -> float:
        self.done.set()
        self.join()
        return self.peak


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    from fedl2p_cli.flower import certs as flower_certs
    certs = tmp_path_factory.mktemp("certs")
    flower_certs.make(certs, 1, ["127.0.0.1"])
    up = SlowUpstream(1.0, certs)
    port = free_ports(1)[0]
    limits = {"body_budget": BUDGET, "max_body": MAX_BODY, "new_per_second": 1000.0}
    env = os.environ | {"PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", GATEWAY, str(port), str(up.server_address[1]), str(certs),
                             json.dumps(limits)], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, 30)
        yield proc, port, ssl.create_default_context(cafile=str(certs / "ca.crt"))
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        up.shutdown()
        assert "Traceback" not in err, err[-2000:]


def tls(port: int, ctx: ssl.SSLContext, i: int) -> ssl.SSLSocket:
    src = f"127.{60 + i // 8}.0.{1 + i % 8}"  # 8 addresses a /24: under every per-prefix limit
    raw = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(src, 0))
    return ctx.wrap_socket(raw, server_hostname="127.0.0.1")


def answer(s: ssl.SSLSocket) -> bytes:
    """One whole answer on a kept-alive connection: its head, then Content-Length bytes (b"" if the gateway closed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    n = next((int(ln.split(b":")[1]) for ln in head.lower().split(b"\r\n") if ln.startswith(b"content-length:")), 0)
    while len(rest) < n and (chunk := s.recv(65536)):
        rest += chunk
    return data


def site(port: int, ctx: ssl.SSLContext, i: int) -> ssl.SSLSocket:
    """A site's connection: one call answered 200, kept alive."""
    s = tls(port, ctx, i)
    s.sendall(request(b"/v1/fleet/get-run", headers={b"flwr-public-key": b"site"}))
    assert answer(s).startswith(b"HTTP/1.1 200")
    return s


def idle_rss(pid: int) -> float:
    time.sleep(1.5)  # the gateway collects closed TLS connections' buffers once a second
    return rss_mib(pid)


def test_memory_stays_within_the_budget_plus_the_stated_overhead_per_connection(gateway):
    proc, port, ctx = gateway
    site(port, ctx, 200).close()  # warm: every module loaded, one TLS session served
    idle = idle_rss(proc.pid)
    peak = Peak(proc.pid)
    peak.start()
    hello = [socket.create_connection(("127.0.0.1", port), source_address=(f"127.70.{i}.1", 0))
             for i in range(HANDSHAKING)]
    for s in hello:
        s.sendall(b"\x16\x03\x01\x00\x05\x01\x00\x00\x01")  # a ClientHello begun, never finished
    sites = [site(port, ctx, i) for i in range(SITES)]
    body = request(b"/v1/fleet/push-object", body=b"\1" * MAX_BODY, headers={b"flwr-public-key": b"site"})
    codes: list[bytes] = []

    def send(s: ssl.SSLSocket) -> None:
        with contextlib.suppress(OSError):
            s.sendall(body)
            codes.append(answer(s)[:12])
    senders = [threading.Thread(target=send, args=(s,)) for s in sites]
    for t in senders:
        t.start()
    for t in senders:
        t.join(30)
    top = peak.stop()
    for s in sites + hello:
        s.close()
    conns = SITES + HANDSHAKING
    bound = idle + BUDGET / MiB + conns * OVERHEAD_KIB / 1024
    assert codes.count(b"HTTP/1.1 200") >= BUDGET // MAX_BODY - 1, codes  # the budget was used, not refused
    print("PEAK", top, bound, idle, codes)
    assert top <= bound, f"peak {top:.1f} MiB over {bound:.1f} (idle {idle:.1f} + budget + {conns} x {OVERHEAD_KIB} KiB)"


def test_a_handshake_flood_leaves_no_buffers_behind(gateway):
    proc, port, ctx = gateway
    idle = idle_rss(proc.pid)
    hello = client_hello(ctx)
    end = time.monotonic() + 2.0
    n = 0
    while time.monotonic() < end:
        with contextlib.suppress(OSError), \
                socket.create_connection(("127.0.0.1", port), timeout=2, source_address=(f"127.80.{n % 16}.1", 0)) as s:
            s.sendall(hello)
            s.recv(4096)  # the ServerHello: the gateway did its part of the key exchange
        n += 1
    after = idle_rss(proc.pid) - idle
    assert n > 50 and after <= 2.0, f"{after:.1f} MiB left after {n} handshakes"


def client_hello(ctx: ssl.SSLContext) -> bytes:
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname="127.0.0.1")
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()
