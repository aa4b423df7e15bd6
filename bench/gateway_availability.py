"""The gateway's availability under strangers, on loopback: `python bench/gateway_availability.py [--quick]`.

A recording SuperLink stands in for the real one (it answers 401 to strangers, 200 to the site's key). Measured, each
against a gateway at its default limits (a scenario that needs shorter timeouts says so):
- how long a site is kept out while strangers hold every slot: 127 and 1,000 connections, from one address and from
  10 (each stranger makes a cheap unauthenticated call, then idles, as in issue 63's report);
- how long a body trickled at one byte every 2 s stays open;
- the process's RSS with the connection cap's worth of 4 MiB bodies arriving slowly;
- requests sent against access-log lines when every client resets before the answer.
Runs against whichever fedl2p is importable (PYTHONPATH=OLD_CHECKOUT measures another commit); options the older code
lacks are left out. Prints one markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import socket
import struct
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fedl2p_cli.flower import fleet_routes as fr  # noqa: E402
from fedl2p_cli.flower import gateway as gw  # noqa: E402
from tests.gateway_attacks import StandIn  # noqa: E402

BODY = b"\x08\x01"


def req(target: bytes = b"/v1/fleet/get-run", key: bytes | None = None, length: int | None = None, body: bytes = BODY,
        close: bool = False) -> bytes:
    h = [b"host: g", b"content-type: application/protobuf", b"content-length: %d" % (len(body) if length is None else length)]
    h += [b"flwr-public-key: " + key] if key else []
    h += [b"connection: close"] if close else []
    return b"POST " + target + b" HTTP/1.1\r\n" + b"\r\n".join(h) + b"\r\n\r\n" + body


class SuperLink(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 2048

    def __init__(self, delay: float = 0.0):
        self.calls = 0

        class H(StandIn):
            protocol_version = "HTTP/1.1"

            def do_POST(h):  # noqa: N802
                h.rfile.read(int(h.headers.get("content-length", 0)))
                self.calls += 1
                time.sleep(delay)
                ok = h.headers.get("flwr-public-key") == "site"
                h.answer(200 if ok else 401)

        super().__init__(("127.0.0.1", 0), H)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def limits(**kw) -> gw.Limits:
    known = gw.Limits.__dataclass_fields__
    return gw.Limits(**{k: v for k, v in kw.items() if k in known})


class Gateway:
    def __init__(self, up: SuperLink, lim: gw.Limits):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.out = io.StringIO()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        g = gw.Gateway(f"http://127.0.0.1:{up.server_address[1]}", False, fr.allowlist(False), lim, gw.AccessLog(self.out))

        def main():
            asyncio.set_event_loop(self.loop)
            self.task = self.loop.create_task(gw.run("127.0.0.1", self.port, g, None, ready.set))
            with contextlib.suppress(asyncio.CancelledError):
                self.loop.run_until_complete(self.task)

        threading.Thread(target=main, daemon=True).start()
        ready.wait(10)

    def stop(self):
        self.loop.call_soon_threadsafe(self.task.cancel)


def connect(port: int, src: str = "127.0.0.1", timeout: float = 5) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(src, 0))


def status(s: socket.socket) -> int:
    try:
        data = s.recv(4096)
    except OSError:
        return 0
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0


def strangers(port: int, n: int, peers: int, stop: threading.Event) -> list[socket.socket]:
    """n connections from `peers` addresses, each making an unauthenticated call, then re-calling every 20 s."""
    socks = []
    for i in range(n):
        try:
            s = connect(port, f"127.0.2.{1 + i % peers}")
            s.sendall(req())
            socks.append(s)
        except OSError:
            pass

    def keep():
        while not stop.wait(20):
            for s in socks:
                with contextlib.suppress(OSError):
                    s.sendall(req())
    threading.Thread(target=keep, daemon=True).start()
    return socks


def kept_out(n: int, peers: int, horizon: float) -> str:
    up = SuperLink()
    g = Gateway(up, limits())
    stop = threading.Event()
    held = strangers(g.port, n, peers, stop)
    time.sleep(1.0)
    t0, tries = time.monotonic(), 0
    got = None
    while time.monotonic() - t0 < horizon:
        tries += 1
        try:
            with connect(g.port, "127.0.3.1") as s:
                s.sendall(req(key=b"site", close=True))
                if status(s) == 200:
                    got = time.monotonic() - t0
                    break
        except OSError:
            pass
        time.sleep(1.0)
    stop.set()
    for s in held:
        s.close()
    g.stop()
    up.shutdown()
    return f"{got:.2f} s (attempt {tries})" if got is not None else f"> {horizon:.0f} s ({tries} attempts, all refused)"


def trickle(horizon: float) -> str:
    up = SuperLink()
    g = Gateway(up, limits(idle_timeout=3.0))
    s = connect(g.port, timeout=horizon)
    s.sendall(req(b"/v1/fleet/push-object", length=1 << 20, body=b""))
    t0, reply = time.monotonic(), b""
    s.settimeout(2.0)
    while time.monotonic() - t0 < horizon:
        try:
            s.sendall(b"x")
            reply = s.recv(4096)  # an answer, or b"" when the gateway closed the connection
            break
        except TimeoutError:
            continue
        except OSError:
            break
    took = time.monotonic() - t0
    s.close()
    g.stop()
    up.shutdown()
    why = reply.split(b"\r\n\r\n", 1)[-1].strip().decode(errors="replace") if reply else "closed"
    return f"{took:.1f} s ({why})" if took < horizon else f"> {horizon:.0f} s (still open)"


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_at_cap() -> str:
    up = SuperLink()
    g = Gateway(up, limits(body_timeout=600, idle_timeout=600, header_timeout=60))
    before = rss_mib()
    socks, chunk = [], b"x" * (1 << 20)
    for i in range(128):
        try:
            s = connect(g.port, f"127.0.4.{1 + i % 16}", timeout=30)
            s.sendall(req(b"/v1/fleet/push-object", length=4 << 20, body=b""))
            socks.append(s)
        except OSError:
            pass
    for _ in range(4):  # each sends 3 MiB of its 4 MiB body, then waits
        for s in socks:
            with contextlib.suppress(OSError):
                s.sendall(chunk[: 3 << 18])
    time.sleep(2.0)
    grew = rss_mib() - before
    for s in socks:
        s.close()
    g.stop()
    up.shutdown()
    return f"+{grew:.0f} MiB"


def resets(n: int) -> str:
    up = SuperLink(delay=0.3)
    g = Gateway(up, limits())
    for _ in range(n):
        s = connect(g.port)
        s.sendall(req(key=b"site"))
        time.sleep(0.05)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    time.sleep(1.5)
    lines = sum("/v1/fleet/" in x for x in g.out.getvalue().splitlines())
    calls = up.calls
    g.stop()
    up.shutdown()
    return f"{n} sent, {calls} reached the SuperLink, {lines} logged"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--horizon", type=float, default=80.0, help="seconds a site keeps trying (the report's test: 80)")
    args = ap.parse_args()
    import fedl2p_cli
    rows = [("code", str(Path(fedl2p_cli.__file__).parents[1]))]
    for n, peers in ((127, 1), (127, 10), (1000, 1), (1000, 10)):
        rows.append((f"site kept out by {n} strangers from {peers} address(es)", kept_out(n, peers, args.horizon)))
    rows.append(("a body trickled at 1 byte / 2 s (idle timeout 3 s)", trickle(max(args.horizon, 90.0) + 30)))
    rows.append(("RSS growth, 128 connections x 3 of 4 MiB bodies", rss_at_cap()))
    rows.append(("client resets before the answer", resets(20)))
    print("| measure | result |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    os._exit(0)  # sockets and threads of the stopped gateways: nothing to wait for


if __name__ == "__main__":
    main()
