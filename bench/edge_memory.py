"""The edges' memory per connection and under TLS floods (part of `make bench-gateway`).

Each edge (the gateway before issue 72, the gateway now, and nginx from `fedl2p flower edge --nginx`) fronts the
recording upstream of bench/edge_attacks.py on loopback with TLS, at its default limits. Measured from /proc (the edge's processes' RSS
summed): its RSS idle after one site call; then per connection, with `--conns` connections from 8 addresses of as
many /24s each (under every per-prefix limit): open and silent (TCP only), handshaking (a ClientHello sent, never
finished) and authenticated (a site's call answered 200, kept alive); the peak while 4 threads replay a ClientHello
from 40 addresses for `--seconds` and the RSS 2 s after the flood ended; and the peak, over the idle RSS, while one site
sends `--body-mib` MiB bodies one after another (the body's copies held at once: 1 means one buffer).

Usage: python bench/edge_memory.py [--conns 96] [--seconds 5]; writes bench/edge_memory.json and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import shutil
import socket
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import edge_attacks as ea  # noqa: E402

from tests.flower_loopback import free_ports, wait_for_port  # noqa: E402


def settle(edge: ea.Edge, seconds: float = 1.5) -> float:
    """RSS once the edge has had `seconds` to free what it frees (the gateway collects closed TLS connections' buffers
    once a second)."""
    time.sleep(seconds)
    return ea.rss_mb(edge.pids())


def addresses(n: int) -> list[str]:
    return [f"127.{150 + i // 8 // 250}.{i // 8 % 250}.{1 + i % 8}" for i in range(n)]


def open_silent(port: int, n: int) -> list[socket.socket]:
    return [ea._connect(port, src) for src in addresses(n)]


def open_handshaking(port: int, n: int, hello: bytes) -> list[socket.socket]:
    out = []
    for src in addresses(n):
        s = ea._connect(port, src)
        s.sendall(hello)
        out.append(s)
    return out


def open_sites(port: int, n: int, certs: Path) -> list[ssl.SSLSocket]:
    """`n` TLS connections, each with one call answered 200 (a site's) and kept alive."""
    out = []
    for src in addresses(n):
        s = ea._tls(port, src, certs)
        s.sendall(ea.request(b"/v1/fleet/get-run", headers={b"flwr-public-key": ea.SITE_KEY}))
        s.settimeout(5)
        assert answer(s).startswith(b"HTTP/1.1 200")
        out.append(s)
    return out


def per_connection(edge: ea.Edge, idle: float, opener, n: int) -> tuple[float, float]:
    """(KiB per connection, MiB with them open) for `n` connections `opener` holds open."""
    socks = opener()
    try:
        held = settle(edge, 1.0)
    finally:
        for s in socks:
            s.close()
    return round((held - idle) * 1024 / n, 1), round(held, 1)


def flood(edge: ea.Edge, certs: Path, seconds: float) -> tuple[float, float]:
    """(peak RSS during a ClientHello flood, RSS 2 s after it), MiB."""
    mon = ea.Monitor(edge)
    mon.start()
    ea.attack_hello_flood(edge.port, certs, time.monotonic() + seconds)
    _, peak = mon.result()
    return round(peak, 1), round(settle(edge, 2.0), 1)


def body_copies(edge: ea.Edge, certs: Path, mib: int, idle: float, rounds: int = 4) -> tuple[float, float]:
    """(peak RSS over idle while a site sends `rounds` bodies of `mib` MiB one after another, that peak in bodies)."""
    body = b"\1" * (mib << 20)
    mon = ea.Monitor(edge)
    fast = threading.Thread(target=_sample_fast, args=(edge, mon), daemon=True)
    fast.start()
    with ea._tls(edge.port, "127.201.0.1", certs) as s:
        for _ in range(rounds):
            s.sendall(ea.request(b"/v1/fleet/push-object", body=body, headers={b"flwr-public-key": ea.SITE_KEY}))
            s.settimeout(10)
            assert answer(s).startswith(b"HTTP/1.1 200")
    mon.stop.set()
    fast.join()
    extra = mon.peak - idle
    return round(extra, 1), round(extra / mib, 2)


def answer(s: ssl.SSLSocket) -> bytes:
    """One whole answer on a kept-alive connection (its head, then Content-Length bytes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    n = int(next(ln.split(b":")[1] for ln in head.lower().split(b"\r\n") if ln.startswith(b"content-length")))
    while len(rest) < n:
        rest += s.recv(65536)
    return data


def _sample_fast(edge: ea.Edge, mon: ea.Monitor) -> None:
    while not mon.stop.is_set():
        mon.peak = max(mon.peak, ea.rss_mb(edge.pids()))
        time.sleep(0.005)


def measure(edge: ea.Edge, certs: Path, conns: int, seconds: float, mib: int) -> dict:
    warm = ea.site_client(edge.port, certs)
    warm.close()
    idle = settle(edge)
    hello = ea.client_hello(certs)
    row = {"edge": edge.name, "idle_mb": round(idle, 1), "conns": conns}
    row["silent_kib"], row["silent_mb"] = per_connection(edge, idle, lambda: open_silent(edge.port, conns), conns)
    idle = settle(edge)
    row["handshaking_kib"], row["handshaking_mb"] = per_connection(
        edge, idle, lambda: open_handshaking(edge.port, conns, hello), conns)
    idle = settle(edge)
    row["site_kib"], row["site_mb"] = per_connection(edge, idle, lambda: open_sites(edge.port, conns, certs), conns)
    row["idle_before_flood_mb"] = round(settle(edge), 1)
    row["flood_peak_mb"], row["after_flood_mb"] = flood(edge, certs, seconds)
    idle = settle(edge)
    row["body_extra_mb"], row["body_copies"] = body_copies(edge, certs, mib, idle)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conns", type=int, default=96, help="connections held open for the per-connection figures")
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds of the ClientHello flood")
    ap.add_argument("--body-mib", type=int, default=4, help="size of the site's bodies (at most --max-body)")
    ap.add_argument("--edges", nargs="*", default=["gateway before", "gateway", "nginx"])
    a = ap.parse_args()
    from fedl2p_cli.flower import certs as flower_certs
    tmp = Path(tempfile.mkdtemp(prefix="edge-memory-"))
    certs = tmp / "certs"
    flower_certs.make(certs, 1, ["127.0.0.1", "localhost"])
    counter = mp.Value("q", 0)
    up = free_ports(1)[0]
    upstream = mp.Process(target=ea.upstream_main, args=(up, certs, 401, counter), daemon=True)
    upstream.start()
    wait_for_port(up, 10)
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        a.edges = [e for e in a.edges if e != "nginx"]
    rows = []
    for name in a.edges:
        edge = (ea.start_nginx(up, certs, tmp) if name == "nginx"
                else ea.start_gateway(name, ea.old_tree(tmp) if name == "gateway before" else ea.REPO, up, certs, tmp))
        try:
            rows.append(measure(edge, certs, a.conns, a.seconds, a.body_mib))
            print(json.dumps(rows[-1]), flush=True)
        finally:
            with contextlib.suppress(Exception):
                edge.stop()
    upstream.kill()
    out = {"cpu": ea.cpu_name(), "rows": rows, "note": "measured on a shared machine (other jobs were running beside it)"}
    (HERE / "edge_memory.json").write_text(json.dumps(out, indent=2) + "\n")
    print(report(out))


def report(out: dict) -> str:
    from fedl2p_cli.analysis import tables
    cols = ["edge", "idle MB", "KiB per silent / handshaking / site connection", "ClientHello flood: peak, 2 s after",
            "site body: extra MB (copies)"]
    body = [[r["edge"], r["idle_mb"], f"{r['silent_kib']} / {r['handshaking_kib']} / {r['site_kib']}",
             f"{r['flood_peak_mb']}, {r['after_flood_mb']} (idle {r['idle_before_flood_mb']})",
             f"{r['body_extra_mb']} ({r['body_copies']})"] for r in out["rows"]]
    return f"CPU: {out['cpu']} ({out['note']})\n" + tables.markdown(cols, body) + "\n"


if __name__ == "__main__":
    main()
