"""One attack suite for both public edges (`make bench-gateway`): the gateway before issue 72, the gateway now, and
nginx from `fedl2p flower edge --nginx`, side by side, on loopback with TLS, at their default limits.

Each edge fronts the same recording upstream (TLS; it answers 200 to a call carrying the site's key and, as the real
SuperLink answers strangers, 412 to another's `activate-node`, 400 to a body it cannot parse, 401 to the rest).
For each attack, a site calls `get-run` every 0.2 s on one kept-alive connection (as a SuperNode's httpx client
does; it reconnects when closed) and on a fresh connection, while attacker processes run for `--seconds`. Measured:
the share of the site's calls answered 200 at the first try (a 503 that flwr would retry counts as a failure here),
their p50 and max latency, the edge's CPU (all its processes, % of one core) and peak RSS, and the stranger calls
that reached the upstream. Attackers come from 127.x.y.z addresses (Linux routes all of 127/8 to loopback), so "200
addresses" are 200 /24 prefixes unless said otherwise.

Usage: python bench/edge_attacks.py [--seconds 5] [--only NAME ...] [--before REV] [--out FILE]; writes
bench/edge_attacks.json (or FILE) and prints a markdown table. The rows named "many:" are the many-prefix mode (issue
81): each attacker in a /24 of its own, 40 to 1,000 of them. Needs the flower extra (httpx, h11, flwr, cryptography)
and nginx for its column.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
from tests.flower_loopback import free_ports, wait_for_port  # noqa: E402
from tests.gateway_attacks import ATTACKS, request  # noqa: E402

BEFORE = "2439d7f"  # the last commit before issue 72's gateway changes
SITE_IP = "127.200.0.1"
SITE_KEY = b"site"


# ---- the upstream: a recording SuperLink stand-in, in a process of its own ------------------------------------------

def upstream_main(port: int, certs: Path, refuse: int, counter) -> None:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        wbufsize = 65536  # head and body in one write (two small writes meet Nagle and a delayed ACK: 40 ms)

        def do_POST(h):  # noqa: N802
            body = h.rfile.read(int(h.headers.get("content-length", 0)))
            ok = h.headers.get("flwr-public-key") == SITE_KEY.decode()
            if not ok:
                with counter.get_lock():
                    counter.value += 1
            if h.path not in ALLOWED:
                with counter.get_lock():
                    counter.value += 1_000_000  # a request outside the allowlist reached the upstream
            h.send_response(200 if ok else stranger_status(h.path, body, refuse))
            h.send_header("content-type", "application/protobuf")
            h.send_header("content-length", "3")
            h.end_headers()
            h.wfile.write(b"\x10\x02\x18")

        def log_message(h, *a):
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 1024

    srv = Server(("127.0.0.1", port), Handler)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(certs / "server.pem"), str(certs / "server.key"))
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.serve_forever()


def stranger_status(path: str, body: bytes, refuse: int) -> int:
    """What the real SuperLink answers a stranger: 412 to `activate-node` signed with an unregistered key, 400 to a
    body it cannot parse (here: one that begins with 0xff), 401 to the rest."""
    if path.endswith("/activate-node"):
        return 412
    return 400 if body[:1] == b"\xff" else refuse


ALLOWED = {f"/v1/fleet/{r}" for r in ("activate-node", "deactivate-node", "send-node-heartbeat", "pull-messages",
                                      "push-messages", "get-run", "get-fab", "push-object", "pull-object",
                                      "confirm-message-received")}


# ---- the edges ---------------------------------------------------------------------------------------------------

GATEWAY = """
import asyncio, ssl, sys
from pathlib import Path
from fedl2p_cli.flower import gateway as g, fleet_routes as fr
port, up, certs, log = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
verify = ssl.create_default_context(cafile=str(certs / "ca.crt"))
gw = g.Gateway(f"https://127.0.0.1:{up}", verify, fr.allowlist(False), g.Limits(), g.AccessLog(open(log, "a")))
asyncio.run(g.run("127.0.0.1", port, gw, g.server_tls(certs / "server.pem", certs / "server.key")))
"""


class Edge:
    def __init__(self, name: str, proc: subprocess.Popen, port: int, log: Path, *more_logs: Path):
        self.name, self.proc, self.port, self.log = name, proc, port, log
        self.logs = (log, *more_logs)

    def log_bytes(self) -> int:
        """Bytes in the edge's logs (nginx: its access and error logs)."""
        return sum(p.stat().st_size for p in self.logs if p.exists())

    def pids(self) -> list[int]:
        out, todo = [], [self.proc.pid]
        while todo:
            p = todo.pop()
            out.append(p)
            for t in Path(f"/proc/{p}/task").glob("*/children"):
                todo += [int(x) for x in t.read_text().split()]
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(5)


def start_gateway(name: str, tree: Path, up: int, certs: Path, tmp: Path) -> Edge:
    port = free_ports(1)[0]
    log = tmp / f"{name.replace(' ', '_')}.log"
    env = os.environ | {"PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    with open(tmp / f"{name.replace(' ', '_')}.out", "a") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen([sys.executable, "-c", GATEWAY, str(port), str(up), str(certs), str(log)], env=env,
                                cwd=tree,  # `python -c` puts the working folder first on sys.path: the tree's
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    wait_for_port(port, 30)
    return Edge(name, proc, port, log)


def start_nginx(up: int, certs: Path, tmp: Path) -> Edge:
    from fedl2p_cli.flower import edge_nginx
    from fedl2p_cli.flower.config import NginxEdgeConfig
    port = free_ports(1)[0]
    cfg = NginxEdgeConfig(nginx=str(tmp / "nginx.conf"), state=str(tmp / "nginx"), listen=f"127.0.0.1:{port}",
                          superlink=f"127.0.0.1:{up}", certfile=str(certs / "server.pem"),
                          keyfile=str(certs / "server.key"), ca=str(certs / "ca.crt"))
    conf = edge_nginx.write(cfg)
    user = "daemon off; user root root;" if os.geteuid() == 0 else "daemon off;"
    proc = subprocess.Popen([shutil.which("nginx") or "/usr/sbin/nginx", "-e", str(tmp / "nginx" / "stderr.log"),
                             "-c", str(conf), "-g", user], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            start_new_session=True)
    wait_for_port(port, 30)
    return Edge("nginx", proc, port, tmp / "nginx" / "access.log", tmp / "nginx" / "error.log")


# ---- measuring ---------------------------------------------------------------------------------------------------

def cpu_ticks(pids: list[int]) -> int:
    total = 0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError):
            pass
    return total


def rss_mb(pids: list[int]) -> float:
    total = 0
    for p in pids:
        try:
            for ln in Path(f"/proc/{p}/status").read_text().splitlines():
                if ln.startswith("VmRSS:"):
                    total += int(ln.split()[1])
        except OSError:
            pass
    return total / 1024


class Monitor(threading.Thread):
    """The edge's CPU time and peak RSS over the attack, sampled every 0.1 s."""

    def __init__(self, edge: Edge):
        super().__init__(daemon=True)
        self.edge, self.stop, self.peak = edge, threading.Event(), 0.0
        self.t0, self.c0 = time.monotonic(), cpu_ticks(edge.pids())

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, rss_mb(self.edge.pids()))
            time.sleep(0.1)

    def result(self) -> tuple[float, float]:
        self.stop.set()
        self.join()
        ticks = cpu_ticks(self.edge.pids()) - self.c0
        return 100 * ticks / os.sysconf("SC_CLK_TCK") / (time.monotonic() - self.t0), self.peak


def machine_busy() -> tuple[int, int]:
    """Busy and total jiffies of all cores since boot (/proc/stat): the machine's load beside the edge's."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def children_cpu() -> float:
    """CPU seconds of this process's children that have ended (the attacker's process, once joined)."""
    import resource
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def site_ctx(certs: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs / "ca.crt"))


HEADERS = {"content-type": "application/protobuf", "flwr-public-key": SITE_KEY.decode()}


def site_client(port: int, certs: Path):
    """The site's kept-alive client, connected with one accepted call (a site in the federation before the attack)."""
    import httpx
    ctx = site_ctx(certs)
    kept = httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=ctx, timeout=5,
                        transport=httpx.HTTPTransport(verify=ctx, local_address=SITE_IP))
    kept.post("/v1/fleet/get-run", content=b"\x08\x01", headers=HEADERS)
    return kept


def site_calls(port: int, certs: Path, seconds: float, kept) -> dict:
    """A site's calls through the edge for `seconds`: alternately on its kept-alive connection and on a fresh one."""
    import httpx
    ctx, headers = site_ctx(certs), HEADERS
    res: dict[str, list] = {"kept": [], "fresh": []}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for mode in ("kept", "fresh"):
            t0 = time.perf_counter()
            try:
                if mode == "kept":
                    code = kept.post("/v1/fleet/get-run", content=b"\x08\x01", headers=headers).status_code
                else:
                    with httpx.Client(base_url=f"https://127.0.0.1:{port}", timeout=5, verify=ctx,
                                      transport=httpx.HTTPTransport(verify=ctx, local_address=SITE_IP)) as c:
                        code = c.post("/v1/fleet/get-run", content=b"\x08\x01", headers=headers).status_code
            except httpx.HTTPError:
                code = 0
            res[mode].append((code, 1e3 * (time.perf_counter() - t0)))
            time.sleep(0.1)
    kept.close()
    return res


# ---- the attacks (each runs in its own process until `end`) --------------------------------------------------------

def _connect(port: int, src: str, timeout: float = 5) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(src, 0))


def _tls(port: int, src: str, certs: Path) -> ssl.SSLSocket:
    raw = _connect(port, src)
    return site_ctx(certs).wrap_socket(raw, server_hostname="127.0.0.1")


def attack_budget_hold(port, certs, end, n=16):
    """16 heads from one address that each declare a 4 MiB body and never send it; re-sent when answered."""
    socks: list = []
    while time.monotonic() < end:
        socks = [s for s in socks if s.fileno() != -1]
        while len(socks) < n:
            try:
                s = _tls(port, "127.66.0.1", certs)
                s.sendall(request(b"/v1/fleet/push-object", body=b"", headers={b"content-length": str(4 << 20).encode()}))
                s.settimeout(0.05)
                socks.append(s)
            except OSError:
                time.sleep(0.05)
                break
        for s in list(socks):
            try:
                if s.recv(1024) == b"":
                    s.close()
            except (TimeoutError, ssl.SSLWantReadError):
                pass
            except OSError:
                s.close()
        time.sleep(0.05)


def attack_refused_flood(port, certs, end, src=None, conns=4, raw=None):
    """Calls the upstream refuses (`raw`, default a `get-run`: 401), as fast as `conns` kept-alive connections from
    `src` go (default: the site's own address: a NAT the site shares with the stranger)."""
    socks: list = [None] * conns
    src = src or SITE_IP
    raw = raw or request(b"/v1/fleet/get-run")
    while time.monotonic() < end:
        for i in range(conns):
            try:
                if socks[i] is None:
                    socks[i] = _tls(port, src, certs)
                socks[i].sendall(raw)
                socks[i].settimeout(2)
                data = socks[i].recv(65536)
                if not data or b"connection: close" in data.lower():
                    socks[i].close()
                    socks[i] = None
            except OSError:
                if socks[i] is not None:
                    socks[i].close()
                socks[i] = None
                time.sleep(0.01)


def attack_refused_400(port, certs, end):
    """Unparsable bodies (answered 400 by the SuperLink) from a stranger's /24, on 4 kept-alive connections."""
    attack_refused_flood(port, certs, end, src="127.82.0.1", raw=request(b"/v1/fleet/get-run", body=b"\xff\xff"))


def attack_refused_412(port, certs, end):
    """`activate-node` signed with a key the SuperLink does not know (answered 412) from a stranger's /24."""
    attack_refused_flood(port, certs, end, src="127.83.0.1", raw=request(b"/v1/fleet/activate-node"))


def attack_slow_reads(port, certs, end, n=64, pipelined=400):
    """64 connections from 64 /24s that each send 400 pipelined calls at once and never read an answer (a receive
    buffer of 4 KiB): the edge's answers pile up towards them."""
    socks = []
    raw = request(b"/v1/fleet/get-run") * pipelined
    for i in range(n):
        try:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.bind((f"127.84.{i}.1", 0))
            s.settimeout(5)
            s.connect(("127.0.0.1", port))
            t = site_ctx(certs).wrap_socket(s, server_hostname="127.0.0.1")
            t.setblocking(False)
            with contextlib.suppress(OSError, ssl.SSLWantWriteError):
                t.send(raw)
            socks.append(t)
        except OSError:
            pass
    while time.monotonic() < end:
        time.sleep(0.2)
    for t in socks:
        t.close()


def attack_refused_spread(port, certs, end):
    """Refused calls from 200 addresses of one /24 (the old limit was per address)."""
    i = 0
    while time.monotonic() < end:
        src = f"127.81.0.{1 + i % 200}"
        i += 1
        try:
            with _tls(port, src, certs) as s:
                s.sendall(request(b"/v1/fleet/get-run", headers={b"connection": b"close"}))
                s.settimeout(2)
                s.recv(65536)
        except OSError:
            pass


def attack_storm(port, certs, end, addresses, rate, hold=True):
    """New TCP connections at `rate`/s spread over `addresses` prefixes, each left open without a byte (or closed
    at once), the oldest closed past 400 held."""
    socks: list = []
    interval, i, t = 1.0 / rate, 0, time.monotonic()
    while time.monotonic() < end:
        try:
            s = _connect(port, f"127.{90 + i % addresses // 250}.{i % addresses % 250}.1", 1)
            if hold:
                socks.append(s)
            else:
                s.close()
        except OSError:
            pass
        i += 1
        if len(socks) > 400:
            socks.pop(0).close()
        t += interval
        pause = t - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    for s in socks:
        s.close()


def attack_fresh_eviction(port, certs, end):
    """50 new connections/s from 200 addresses, each held: a site's fresh connection must not be the victim."""
    attack_storm(port, certs, end, 200, 50)


def client_hello(certs: Path) -> bytes:
    ctx = site_ctx(certs)
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname="127.0.0.1")
    with contextlib.suppress(ssl.SSLWantReadError):  # it waits for the ServerHello: the ClientHello is written
        obj.do_handshake()
    return out.read()


def attack_hello_flood(port, certs, end, threads=4):
    """One recorded ClientHello replayed on new connections from 40 addresses in 4 /24s (one per thread; no
    cryptography on our side): each makes the edge do a key exchange and sign."""
    hello = client_hello(certs)

    def loop(k):
        i = 0
        while time.monotonic() < end:
            try:
                with _connect(port, f"127.95.{k}.{1 + i % 10}", 2) as s:
                    s.sendall(hello)
                    s.settimeout(1)
                    s.recv(4096)
            except OSError:
                pass
            i += 1
    ts = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def attack_big_bodies(port, certs, end, conns=8):
    """Bodies of the full 4 MiB, sent as fast as they go from 8 connections of one /24."""
    body = b"\0" * (4 << 20) 

    def loop(k):
        while time.monotonic() < end:
            try:
                with _tls(port, f"127.97.0.{k + 1}", certs) as s:
                    s.sendall(request(b"/v1/fleet/push-object", body=body, headers={b"connection": b"close"}))
                    s.settimeout(5)
                    s.recv(4096)
            except OSError:
                time.sleep(0.05)
    ts = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(conns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def attack_slow_heads(port, certs, end, n=200):
    """200 connections from 200 addresses that each send a request head a byte a second."""
    socks = []
    for i in range(n):
        try:
            s = _tls(port, f"127.98.{i}.1", certs)
            s.setblocking(False)
            socks.append(s)
        except OSError:
            pass
    head = request(b"/v1/fleet/get-run")
    k = 0
    while time.monotonic() < end:
        for s in socks:
            with contextlib.suppress(OSError, ssl.SSLWantWriteError):
                s.send(head[k % len(head):k % len(head) + 1])
        k += 1
        time.sleep(1.0)


def many(n: int, first: int = 100) -> list[str]:
    """`n` addresses, each in a /24 of its own (127.first.0.1, 127.first.1.1, ...): the many-prefix mode."""
    return [f"127.{first + i // 250}.{i % 250}.1" for i in range(n)]


def attack_many_refused(port, certs, end, n=500, threads=50, raw=None):
    """Calls the upstream refuses (`raw`, default a `get-run`: 401) from `n` /24s, one kept-alive connection each
    (reopened when closed), driven by `threads` threads that each take their share of the prefixes in turn: every
    prefix stays under its limits."""
    raw = raw or request(b"/v1/fleet/get-run")
    sources = many(n)

    def loop(mine: list[str]) -> None:
        socks: dict[str, ssl.SSLSocket] = {}
        while time.monotonic() < end:
            for src in mine:
                try:
                    s = socks.get(src) or socks.setdefault(src, _tls(port, src, certs))
                    s.sendall(raw)
                    s.settimeout(2)
                    data = s.recv(65536)
                    if not data or b"connection: close" in data.lower():
                        raise ConnectionError
                except OSError:
                    with contextlib.suppress(OSError, KeyError):
                        socks.pop(src).close()
        for s in socks.values():
            s.close()
    ts = [threading.Thread(target=loop, args=(sources[k::threads],), daemon=True) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def keep_open(slots: list[str], end: float, open_one, pause: float, each=None) -> None:
    """One connection per entry of `slots` (its source address), opened by `open_one(src)` and opened again when the
    edge closes it, until `end`; `each(sock)` runs on every open one each round (default: a read that sees a close)."""
    socks: list = [None] * len(slots)
    while time.monotonic() < end:
        for i, src in enumerate(slots):
            try:
                if socks[i] is None:
                    socks[i] = open_one(src)
                else:
                    (each or _seen_closed)(socks[i])
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                pass
            except OSError:
                with contextlib.suppress(OSError, AttributeError):
                    socks[i].close()
                socks[i] = None
            if time.monotonic() >= end:
                break
        time.sleep(min(pause, max(0.0, end - time.monotonic())))
    for s in socks:
        with contextlib.suppress(OSError, AttributeError):
            s.close()


def _seen_closed(s) -> None:
    if s.recv(1024) == b"":
        raise ConnectionError


def attack_many_slow_bodies(port, certs, end, prefixes=40, per_prefix=16, every=10.0):
    """`prefixes` x `per_prefix` connections (each prefix at its --max-per-peer) that send a head declaring 1,000
    bytes of body and then 1 byte every `every` seconds; a closed one is reopened."""
    head = request(b"/v1/fleet/push-object", body=b"", headers={b"content-length": b"1000"})

    def open_one(src):
        s = _tls(port, src, certs)
        s.sendall(head + b"x")
        return s
    keep_open([src for src in many(prefixes, 110) for _ in range(per_prefix)], end, open_one, every,
              lambda s: s.sendall(b"x"))


def attack_many_400(port, certs, end):
    """Unparsable bodies (answered 400 by the SuperLink) from 500 /24s."""
    attack_many_refused(port, certs, end, raw=request(b"/v1/fleet/get-run", body=b"\xff\xff"))


def attack_many_412(port, certs, end):
    """`activate-node` signed with a key the SuperLink does not know (answered 412) from 500 /24s."""
    attack_many_refused(port, certs, end, raw=request(b"/v1/fleet/activate-node"))


def attack_many_budget_hold(port, certs, end, prefixes=100, per_prefix=2, sent=1 << 20):
    """Heads declaring 4 MiB from `prefixes` /24s, `per_prefix` connections each, that send `sent` bytes of the body
    at once and then nothing: together they would hold 200 MiB of bodies; a closed one is reopened."""
    head = request(b"/v1/fleet/push-object", body=b"", headers={b"content-length": str(4 << 20).encode()})

    def open_one(src):
        s = _tls(port, src, certs)
        s.settimeout(1)
        s.sendall(head + b"\0" * sent)
        s.setblocking(False)
        return s
    keep_open([src for src in many(prefixes, 130) for _ in range(per_prefix)], end, open_one, 0.1)


def attack_many_silent(port, certs, end, prefixes=500, per_prefix=2):
    """TCP connections from `prefixes` /24s, `per_prefix` each, that never send a byte (not even a ClientHello);
    a closed one is reopened."""
    def open_one(src):
        s = _connect(port, src, 1)
        s.setblocking(False)
        return s
    keep_open([src for src in many(prefixes, 140) for _ in range(per_prefix)], end, open_one, 0.2)


def attack_many_slow_reads(port, certs, end):
    """Slow readers from 128 /24s (400 pipelined calls each, never read)."""
    attack_slow_reads(port, certs, end, n=128)


def attack_many_hellos(port, certs, end, prefixes=48, threads=4):
    """The replayed ClientHello from 48 /24s (one address each), 4 threads."""
    hello = client_hello(certs)
    sources = many(prefixes, 120)

    def loop(k):
        i = k
        while time.monotonic() < end:
            try:
                with _connect(port, sources[i % prefixes], 2) as s:
                    s.sendall(hello)
                    s.settimeout(1)
                    s.recv(4096)
            except OSError:
                pass
            i += threads
    ts = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


MANY = [  # the many-prefix mode (issue 81): each attacker in a /24 of its own
    ("many: refused calls from 500 /24s", attack_many_refused, {}),
    ("many: slow bodies, 640 connections from 40 /24s, 1 byte/10 s", attack_many_slow_bodies, {"warmup": 4.0}),
    ("many: storm from 1000 /24s, 1000/s", attack_storm, {"addresses": 1000, "rate": 1000}),
    ("many: slow reads from 128 /24s", attack_many_slow_reads, {"warmup": 2.0}),
    ("many: replayed ClientHello from 48 /24s", attack_many_hellos, {}),
    ("many: 400 flood: unparsable bodies from 500 /24s", attack_many_400, {}),
    ("many: 412 flood: activate-node with an unknown key from 500 /24s", attack_many_412, {}),
    ("many: budget hold: 200 heads of 4 MiB from 100 /24s, 1 MiB sent each", attack_many_budget_hold, {"warmup": 4.0}),
    ("many: silent connections: 1000 from 500 /24s", attack_many_silent, {"warmup": 4.0}),
]

ATTACK_LIST = [
    ("none (baseline)", None, {}),
    ("budget hold: 16 heads of 4 MiB, no body", attack_budget_hold, {"warmup": 4.0}),
    ("NAT-shared address: refused calls (401)", attack_refused_flood, {}),
    ("refused calls from 200 addresses of one /24", attack_refused_spread, {}),
    ("400 flood: unparsable bodies from a stranger's /24", attack_refused_400, {}),
    ("412 flood: activate-node with an unknown key, a stranger's /24", attack_refused_412, {}),
    ("fresh-connection eviction: 50/s from 200 addresses", attack_fresh_eviction, {}),
    *[(f"storm: {n} addresses, {r}/s", attack_storm, {"addresses": n, "rate": r})
      for n in (10, 50, 200) for r in (100, 300, 1000)],
    ("replayed ClientHello flood (40 addresses, 4 /24s)", attack_hello_flood, {}),
    ("bodies at the limit: 8 x 4 MiB", attack_big_bodies, {}),
    ("slow heads: 200 connections, 1 byte/s", attack_slow_heads, {"warmup": 4.0}),
    ("slow reads: 64 connections, 400 calls each, never read", attack_slow_reads, {"warmup": 2.0}),
    *MANY,
]


def run_attack(fn, kw, port, certs, seconds):
    end = time.monotonic() + seconds
    fn(port, certs, end, **kw)


def measure(edge: Edge, name: str, fn, kw, certs: Path, seconds: float, counter, k: int) -> dict:
    """One attack on one edge; the site has an address of its own for it (the old gateway's per-address limit would
    otherwise carry one attack's effect into the next)."""
    global SITE_IP
    SITE_IP = f"127.200.{k}.1"
    before, logged, t0 = counter.value, edge.log_bytes(), time.monotonic()
    busy0, attacker0 = machine_busy(), children_cpu()
    kw = dict(kw)
    warmup = kw.pop("warmup", 1.0)
    kept = site_client(edge.port, certs)
    mon = Monitor(edge)
    mon.start()
    proc = None
    if fn is not None:
        proc = mp.Process(target=run_attack, args=(fn, kw, edge.port, certs, seconds + warmup), daemon=True)
        proc.start()
        time.sleep(warmup)  # the attack under way
    res = site_calls(edge.port, certs, seconds, kept)
    if proc is not None:
        proc.join(seconds + 10)
        if proc.is_alive():
            proc.kill()
    cpu, peak = mon.result()
    elapsed = time.monotonic() - t0
    log_rate = (edge.log_bytes() - logged) / elapsed
    busy1 = machine_busy()
    machine = 100 * (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]) * (os.cpu_count() or 1)
    reached = counter.value - before
    lat = [ms for mode in res.values() for code, ms in mode if code == 200] or [float("nan")]
    time.sleep(1.5)  # let the edge settle before the next attack
    return {"edge": edge.name, "attack": name,
            "kept_ok": f"{sum(c == 200 for c, _ in res['kept'])}/{len(res['kept'])}",
            "fresh_ok": f"{sum(c == 200 for c, _ in res['fresh'])}/{len(res['fresh'])}",
            "codes": sorted({c for mode in res.values() for c, _ in mode}),
            "p50_ms": round(statistics.median(lat), 1), "max_ms": round(max(lat), 1),
            "cpu_pct": round(cpu), "peak_rss_mb": round(peak, 1), "log_bytes_per_s": round(log_rate),
            "attacker_cpu_pct": round(100 * (children_cpu() - attacker0) / elapsed),
            "machine_cpu_pct": round(machine), "load1": round(os.getloadavg()[0], 1),
            "strangers_upstream": reached % 1_000_000, "outside_allowlist_upstream": reached // 1_000_000}


def reach_set(edge: Edge, counter) -> dict:
    """The gateway's attack list (traversal, smuggling, absolute form, upgrades...) over TLS: what reached the
    upstream outside the allowlist."""
    before, refused = counter.value, 0
    upgrade = request(b"/v1/fleet/get-run", headers={b"upgrade": b"websocket", b"connection": b"Upgrade"})
    for _, raw, _ in ATTACKS + [("upgrade", upgrade, set())]:
        try:
            with _tls(edge.port, "127.99.0.1", CERTS) as s:
                s.sendall(raw)
                s.settimeout(1)
                data = s.recv(65536)
                refused += data.startswith(b"HTTP/1.1 4") or data.startswith(b"HTTP/1.1 5")
        except OSError:
            refused += 1
    return {"edge": edge.name, "requests": len(ATTACKS) + 1, "answered_4xx_5xx_or_cut": refused,
            "outside_allowlist_upstream": (counter.value - before) // 1_000_000}


CERTS = Path()


def old_tree(tmp: Path, rev: str = BEFORE) -> Path:
    tree = tmp / "before"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "fedl2p_cli"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def cpu_name() -> str:
    import torch
    name = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")), "?")
    return f"{name}, {os.cpu_count()} cores, torch CPU capability {torch.backends.cpu.get_cpu_capability()}"


def main() -> None:
    global CERTS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds each attack runs while the site calls")
    ap.add_argument("--only", nargs="*", help="attack names (a prefix of each) to run")
    ap.add_argument("--edges", nargs="*", default=["gateway before", "gateway", "nginx"])
    ap.add_argument("--before", default=BEFORE, help="the commit 'gateway before' runs (default: before issue 72)")
    ap.add_argument("--out", default="edge_attacks.json", help="file name in bench/ for the results")
    a = ap.parse_args()
    from fedl2p_cli.flower import certs as flower_certs
    tmp = Path(tempfile.mkdtemp(prefix="edge-attacks-"))
    CERTS = tmp / "certs"
    flower_certs.make(CERTS, 1, ["127.0.0.1", "localhost"])  # as `fedl2p flower credentials` makes it
    counter = mp.Value("q", 0)
    up = free_ports(1)[0]
    upstream = mp.Process(target=upstream_main, args=(up, CERTS, 401, counter), daemon=True)
    upstream.start()
    wait_for_port(up, 10)
    starters = {"gateway before": lambda: start_gateway("gateway before", old_tree(tmp, a.before), up, CERTS, tmp),
                "gateway": lambda: start_gateway("gateway", REPO, up, CERTS, tmp),
                "nginx": lambda: start_nginx(up, CERTS, tmp)}
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        print("nginx is not installed: its column is left out (apt-get install nginx-light)")
        a.edges = [e for e in a.edges if e != "nginx"]
    attacks = [x for x in ATTACK_LIST if not a.only or any(x[0].startswith(o) for o in a.only)]
    rows, reach = [], []
    for name in a.edges:
        edge = starters[name]()
        try:
            for k, (attack, fn, kw) in enumerate(attacks):
                rows.append(measure(edge, attack, fn, kw, CERTS, a.seconds, counter, k))
                print(json.dumps(rows[-1]), flush=True)
            reach.append(reach_set(edge, counter))
        finally:
            edge.stop()
    upstream.kill()
    out = {"cpu": cpu_name(), "seconds": a.seconds, "rows": rows, "reach": reach,
           "note": "measured on a shared machine (other jobs were running beside it)"}
    (HERE / a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(report(out))


def report(out: dict) -> str:
    from fedl2p_cli.analysis import tables
    edges = list(dict.fromkeys(r["edge"] for r in out["rows"]))
    cols = ["attack"] + [f"{e}: {k}" for e in edges
                         for k in ("site ok kept/fresh", "p50/max ms", "CPU %, RSS MB, log B/s, strangers upstream")]
    by = {(r["attack"], r["edge"]): r for r in out["rows"]}
    body = []
    for attack in dict.fromkeys(r["attack"] for r in out["rows"]):
        row = [attack]
        for e in edges:
            r = by.get((attack, e))
            row += ([f"{r['kept_ok']} / {r['fresh_ok']}", f"{r['p50_ms']} / {r['max_ms']}",
                     f"{r['cpu_pct']}, {r['peak_rss_mb']}, {r.get('log_bytes_per_s', '-')}, "
                     f"{r['strangers_upstream']}"] if r else ["", "", ""])
        body.append(row)
    reach = "; ".join(f"{r['edge']}: {r['answered_4xx_5xx_or_cut']}/{r['requests']} refused, "
                      f"{r['outside_allowlist_upstream']} outside the allowlist upstream" for r in out["reach"])
    return (f"CPU: {out['cpu']} ({out['note']}); each attack {out['seconds']:g} s; site ok: calls answered 200 at "
            "the first try, on its kept-alive connection / on a fresh one; p50/max of those; strangers upstream: "
            "stranger calls the upstream answered\n"
            + tables.markdown(cols, body) + f"\nreach set: {reach}\n")


if __name__ == "__main__":
    main()
