"""`make bench-gateway` (needs the flower extra): the Fleet gateway's cost and its memory under a hostile body.

Starts an insecure SuperLink on loopback and `fedl2p flower gateway` in front of it, then measures, in one run:
- the gateway's resident memory idle, and its peak while a client sends a 256 MB body with no authentication headers
  to an allowlisted path (`/v1/fleet/push-object`), sampled from /proc every 20 ms;
- requests per second of one client on one kept-alive connection (`get-run`, a small protobuf call the SuperLink
  answers at once) through the gateway and directly to the SuperLink, interleaved in blocks, as a ratio of medians.
`--old FILE` measures a gateway module of an earlier version beside (its `fleet_app(upstream, verify)` under uvicorn).
Writes bench/gateway.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from fedl2p_cli.analysis import tables  # noqa: E402
from tests.flower_loopback import free_ports, wait_for_port  # noqa: E402

BIN = Path(sys.executable).parent
BODY = 256 << 20


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def start(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=open(log, "a"), stderr=subprocess.STDOUT, start_new_session=True)


def old_gateway(path: Path, port: int, link: int) -> list[str]:
    code = (f"import importlib.util, uvicorn; s = importlib.util.spec_from_file_location('g', {str(path)!r}); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            f"uvicorn.run(m.fleet_app('http://127.0.0.1:{link}', False), host='127.0.0.1', port={port}, "
            "log_level='warning')")
    return [sys.executable, "-c", code]


def big_body(port: int) -> int:
    """Send a 256 MB body (streamed, no auth headers); the status, or 0 if the gateway cut the connection."""
    import httpx

    def chunks():
        block = b"\0" * (1 << 20)
        for _ in range(BODY >> 20):
            yield block
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/v1/fleet/push-object", content=chunks(), timeout=120,
                       headers={"content-type": "application/protobuf", "content-length": str(BODY)})
        return r.status_code
    except httpx.HTTPError:
        return 0


def memory(pid: int, port: int) -> dict:
    time.sleep(1.0)
    idle, peak, done = rss_mb(pid), [0.0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb(pid))
            time.sleep(0.02)
    t = threading.Thread(target=sample)
    t.start()
    status = big_body(port)
    time.sleep(0.5)
    done.set()
    t.join()
    return {"idle_mb": round(idle, 1), "peak_256mb_body_mb": round(peak[0], 1), "status": status}


def rate(ports: dict[str, int], blocks: int, n: int) -> dict:
    """Requests per second per target, interleaved blocks of n calls on one kept-alive connection each."""
    import httpx
    clients = {k: httpx.Client(base_url=f"http://127.0.0.1:{p}") for k, p in ports.items()}
    body, headers = b"\x08\x01", {"content-type": "application/protobuf"}
    seen, per = {}, {k: [] for k in ports}
    for _ in range(blocks):
        for k, c in clients.items():
            t0 = time.perf_counter()
            for _ in range(n):
                seen[k] = c.post("/v1/fleet/get-run", content=body, headers=headers).status_code
            per[k].append(n / (time.perf_counter() - t0))
    return {k: {"rps_median": round(statistics.median(v), 1), "status": seen[k]} for k, v in per.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, help="an earlier gateway module (defines fleet_app) to measure beside")
    ap.add_argument("--blocks", type=int, default=7, help="interleaved blocks per target for the request rate")
    ap.add_argument("--n", type=int, default=200, help="requests per block")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    env_home = tmp / "flwr_home"
    env_home.mkdir()
    os.environ["FLWR_HOME"] = str(env_home)
    os.environ["PATH"] = f"{BIN}{os.pathsep}{os.environ['PATH']}"  # flower-superlink starts flower-superexec
    link, gw, old = free_ports(3)
    procs = [start([str(BIN / "flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(link),
                    "--database", ":flwr-in-memory:", "--disable-runtime-dependency-installation"], tmp / "link.log")]
    try:
        wait_for_port(link)
        # the bench's calls carry no node key (the SuperLink answers 401): lift the per-address limit on such calls,
        # which would otherwise answer them at the gateway (429) and measure no forwarding (older code lacks it)
        helptext = subprocess.run([str(BIN / "fedl2p"), "flower", "gateway", "--help"], capture_output=True, text=True,
                                  env=os.environ | {"COLUMNS": "200"}).stdout
        lift = ["--unauth-per-minute", "100000000"] if "--unauth-per-minute" in helptext else []
        procs.append(start([str(BIN / "fedl2p"), "flower", "gateway", "--listen", f"127.0.0.1:{gw}", "--superlink",
                            f"127.0.0.1:{link}", "--access-log", str(tmp / "access.log"), *lift], tmp / "gw.log"))
        gateways = {"gateway": (procs[-1], gw)}
        if a.old:
            procs.append(start(old_gateway(a.old, old, link), tmp / "old.log"))
            gateways["old gateway"] = (procs[-1], old)
        for _, p in gateways.values():
            wait_for_port(p)
        out = {"cpu": cpu(), "memory": {k: memory(p.pid, port) for k, (p, port) in gateways.items()}}
        ports = {"direct": link} | {k: port for k, (_, port) in gateways.items()}
        out["rate"] = rate(ports, a.blocks, a.n)
        direct = out["rate"]["direct"]["rps_median"]
        for k in gateways:
            out["rate"][k]["vs_direct"] = round(out["rate"][k]["rps_median"] / direct, 3)
    finally:
        for p in procs:
            os.killpg(p.pid, 9)
    (HERE / "gateway.json").write_text(json.dumps(out, indent=2) + "\n")
    print(report(out))


def report(out: dict) -> str:
    """The measurements as printed: the CPU, then one row per gateway and the direct rate."""
    cols = ["gateway", "RSS idle (MB)", "RSS peak, 256 MB body (MB)", "answer", "requests/s", "vs direct"]
    rows = [[k, m["idle_mb"], m["peak_256mb_body_mb"], m["status"] or "cut", out["rate"][k]["rps_median"],
             out["rate"][k]["vs_direct"]] for k, m in out["memory"].items()]
    rows.append(["direct to the SuperLink", "", "", "", out["rate"]["direct"]["rps_median"], 1])
    return f"CPU: {out['cpu']}\n" + tables.markdown(cols, rows)

def cpu() -> str:
    import platform
    name = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                 if ln.startswith("model name")), platform.processor())
    return f"{name}, {os.cpu_count()} cores"


if __name__ == "__main__":
    main()
