"""A real flwr SuperNode behind each edge under the attacks whose outcome depends on flwr's retries (part of `make
bench-gateway`): does the site stay in the federation?

For each edge (the gateway before issue 72, the gateway now, nginx), a SuperLink with TLS and SuperNode
authentication on loopback, the edge in front, and one registered SuperNode that activates and then polls. Each
attack runs for `--seconds` from loopback; the SuperNode's calls are read from the edge's access log (the attackers
call `get-run`, the SuperNode `pull-messages`/`send-node-heartbeat`): its answered polls during the attack and in the
`--after` seconds after it, and whether its process is still up. The NAT attack comes from 127.0.0.1, the SuperNode's
own address; the SuperLink answers the stranger's calls as it answers them (401 without a signature, 400 for a body
it cannot parse). Writes bench/edge_supernode.json and prints a table.
"""

from __future__ import annotations

import argparse
import calendar
import json
import multiprocessing as mp
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import edge_attacks as ea  # noqa: E402

from tests.flower_loopback import Loopback  # noqa: E402

POLL = re.compile(r" POST /v1/fleet/(pull-messages|send-node-heartbeat) (\d{3}) ")


def nat_flood(port, certs, end):
    ea.attack_refused_flood(port, certs, end, src="127.0.0.1")


def nat_400(port, certs, end):
    ea.attack_refused_flood(port, certs, end, src="127.0.0.1", raw=ea.request(b"/v1/fleet/get-run", body=b"\xff\xff"))


def nat_412(port, certs, end):
    ea.attack_refused_flood(port, certs, end, src="127.0.0.1", raw=ea.request(b"/v1/fleet/activate-node"))


def storm(port, certs, end):
    ea.attack_storm(port, certs, end, 200, 1000)


ATTACKS = [("NAT-shared address: refused calls (401)", nat_flood),
           ("budget hold: 16 heads of 4 MiB, no body", ea.attack_budget_hold),
           ("NAT-shared address: unparsable bodies", nat_400),
           ("NAT-shared address: activate-node with an unknown key", nat_412),
           ("fresh-connection eviction: 50/s from 200 addresses", ea.attack_fresh_eviction),
           ("storm: 200 addresses, 1000/s", storm),
           ("replayed ClientHello flood (40 addresses, 4 /24s)", ea.attack_hello_flood),
           ("slow reads: 64 connections, 400 calls each, never read", ea.attack_slow_reads),
           # the many-prefix mode (issue 81): each attacker in a /24 of its own
           ("many: refused calls from 500 /24s", ea.attack_many_refused),
           ("many: slow bodies, 640 connections from 40 /24s, 1 byte/10 s", ea.attack_many_slow_bodies)]


def polls(log: Path, since: float, until: float) -> tuple[int, int]:
    """The SuperNode's polls in the log between two times (by the log's whole seconds): (answered 200, others)."""
    ok = bad = 0
    for ln in log.read_text(errors="replace").splitlines():
        m = POLL.search(ln)
        if not m:
            continue
        stamp = ln.split(" ", 1)[0]
        t = calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S"))  # both edges log UTC here
        if since - 1 <= t <= until + 1:
            ok += m.group(2) == "200"
            bad += m.group(2) != "200"
    return ok, bad


def federation(edge: str, tmp: Path, old: Path | None) -> Loopback:
    if old is not None:  # the old gateway: its own package tree first on the path of `fedl2p`
        os.environ["PYTHONPATH"] = str(old)
    try:
        fed = Loopback(tmp, True, gateway="nginx" if edge == "nginx" else True, sites=1)
    finally:
        os.environ.pop("PYTHONPATH", None)
    return fed


def run_edge(edge: str, tmp: Path, old: Path | None, seconds: float, after: float, only: list[str]) -> list[dict]:
    rows = []
    for k, (name, fn) in enumerate(ATTACKS):
        if only and not any(name.startswith(o) for o in only):
            continue
        work = tmp / f"{edge.replace(' ', '_')}-{k}"
        work.mkdir()
        fed = federation(edge, work, old)
        try:
            node = fed.start_one_site(work)
            log = fed.log("gateway")  # the gateway's standard output, or nginx's --access-log
            deadline = time.time() + 60
            while time.time() < deadline and polls(log, 0, time.time() + 5)[0] == 0:
                time.sleep(0.5)
            t0 = time.time()
            proc = mp.Process(target=ea.run_attack, args=(fn, {}, fed.fleet, fed.certs, seconds), daemon=True)
            proc.start()
            proc.join(seconds + 10)
            t1 = time.time()
            time.sleep(after)
            during, after_ok = polls(log, t0 + 2, t1), polls(log, t1 + 2, time.time())
            rows.append({"edge": edge, "attack": name, "polls_ok_during": during[0], "polls_refused_during": during[1],
                         "polls_ok_after": after_ok[0], "supernode_up": node.poll() is None})
            print(json.dumps(rows[-1]), flush=True)
        finally:
            fed.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--after", type=float, default=10.0)
    ap.add_argument("--only", nargs="*", help="attack names (a prefix of each) to run")
    ap.add_argument("--edges", nargs="*", default=["gateway before", "gateway", "nginx"])
    ap.add_argument("--before", default=ea.BEFORE, help="the commit 'gateway before' runs (default: before issue 72)")
    ap.add_argument("--out", default="edge_supernode.json", help="file name in bench/ for the results")
    a = ap.parse_args()
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        a.edges = [e for e in a.edges if e != "nginx"]
    tmp = Path(tempfile.mkdtemp(prefix="edge-supernode-"))
    old = ea.old_tree(tmp, a.before) if "gateway before" in a.edges else None
    rows = []
    for edge in a.edges:
        rows += run_edge(edge, tmp, old if edge == "gateway before" else None, a.seconds, a.after, a.only or [])
    out = {"cpu": ea.cpu_name(), "seconds": a.seconds, "after": a.after, "rows": rows}
    (HERE / a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"CPU: {out['cpu']}; a real SuperNode (flwr {version()}) behind each edge, each attack {a.seconds:g} s, "
          f"then {a.after:g} s after")
    print("| edge | attack | SuperNode polls answered / refused during | answered after | SuperNode up |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['edge']} | {r['attack']} | {r['polls_ok_during']} / {r['polls_refused_during']} | "
              f"{r['polls_ok_after']} | {'yes' if r['supernode_up'] else 'no'} |")


def version() -> str:
    from importlib.metadata import version as v
    return v("flwr")


if __name__ == "__main__":
    main()
