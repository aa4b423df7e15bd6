"""A real flwr SuperNode behind each edge through a many-prefix attack (issue 81): refused calls from 500 /24s, as
`bench/edge_supernode.py --only many:` runs it, shortened. The SuperNode must keep polling during the attack and after
it, and its process stay up (flwr 1.41 gives up reconnecting for good on a TLS error at connect: a lost site, silent).
Polls are counted in the edge's access log, line by line; nothing here is timed beyond waiting for them."""

from __future__ import annotations

import importlib.util
import multiprocessing
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.flower_loopback import REPO, Loopback

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("flwr", "httpx", "h11", "cryptography")),
    reason="needs the flower extra (flwr, httpx, h11, cryptography)")

sys.path.insert(0, str(REPO / "bench"))
POLL = re.compile(r" POST /v1/fleet/(?:pull-messages|send-node-heartbeat) 200 ")
ATTACK_S = 10.0


def answered(log: Path) -> int:
    """The SuperNode's polls the edge answered 200 so far (the attackers call `get-run`)."""
    return len(POLL.findall(log.read_text(errors="replace"))) if log.exists() else 0


def wait_polls(log: Path, n: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while answered(log) < n and time.monotonic() < deadline:
        time.sleep(0.5)
    return answered(log)


@pytest.mark.parametrize("edge", ["gateway", "nginx"])
def test_a_real_supernode_keeps_polling_through_refused_calls_from_500_prefixes(tmp_path, edge):
    if edge == "nginx" and not (shutil.which("nginx") or Path("/usr/sbin/nginx").exists()):
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    import edge_attacks as ea
    fed = Loopback(tmp_path, True, gateway="nginx" if edge == "nginx" else True, sites=1)
    fork = multiprocessing.get_context("fork")
    try:
        node = fed.start_one_site(tmp_path)
        log = fed.log("gateway")  # the gateway's standard output, or nginx's --access-log
        assert wait_polls(log, 1, 60) >= 1, log.read_text(errors="replace")[-2000:]
        before = answered(log)
        attack = fork.Process(target=ea.run_attack, args=(ea.attack_many_refused, {}, fed.fleet, fed.certs, ATTACK_S),
                              daemon=True)
        attack.start()
        attack.join(ATTACK_S + 15)
        if attack.is_alive():
            attack.kill()
        during = answered(log) - before
        after = wait_polls(log, before + during + 2, 30) - before - during
        assert node.poll() is None, fed.log("node1").read_text(errors="replace")[-2000:]
        assert during >= 1 and after >= 2, (during, after, fed.log("node1").read_text(errors="replace")[-2000:])
    finally:
        fed.close()
