"""The Flower engine: the wire format (always), and `--engine flower` against the in-process engine (only where the
optional extra is installed: `make test-flower` builds a venv with it)."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import shutil

import pytest
import torch

from fedl2p_cli.algorithms.fedl2p import ClientResult
from fedl2p_cli.artifacts import Store
from fedl2p_cli.errors import USER_ERRORS, FedL2PError
from fedl2p_cli.engine import wire
from fedl2p_cli.runtime import Runtime
from fedl2p_cli.io import weights
from fedl2p_cli.stages.meta_train import MetaReply, MetaTask

from .conftest import TINY_META, TINY_PRETRAIN

HAS_FLOWER = all(importlib.util.find_spec(m) is not None for m in ("flwr", "ray"))
needs_flower = pytest.mark.skipif(not HAS_FLOWER, reason="Flower extra not installed (pip install 'fedl2p[flower]'; "
                                  "`make test-flower` runs these)")


def test_wire_round_trip_is_exact():
    lam = {"bnnet.0.weight": torch.randn(3, 4), "eta": torch.tensor([1e-3, float("nan")]), "n": torch.arange(3)}
    res = ClientResult(lam, 40, 0.1 + 0.2, float("inf"), torch.rand(3), torch.rand(5), {"gnorm": 1 / 3})
    task = (7, lam, 2, [1.5, None, "x"], (True,))
    replies = (MetaReply(res, {"clients": 0.25}), MetaReply(None, {}, "client 3: diverged"))
    for obj in (task, MetaTask(7, lam, 2), *replies):
        tensors, skeleton = wire.pack(obj)
        back = wire.unpack({k: v.clone() for k, v in tensors.items()}, skeleton)
        assert _same(obj, back)
    assert type(wire.unpack(*wire.pack((1, 2)))) is tuple and type(wire.unpack(*wire.pack([1, 2]))) is list


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(-1).view(torch.uint8) if a.is_floating_point()
                                                                           else a, b.view(-1).view(torch.uint8)
                                                                           if b.is_floating_point() else b)
    if isinstance(a, float):
        return isinstance(b, float) and (a == b or (math.isnan(a) and math.isnan(b)))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if dataclasses.is_dataclass(a):  # ClientResult, MetaTask, MetaReply
        return type(b) is type(a) and all(_same(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    return a == b and type(a) is type(b)


def test_wire_refuses_code_outside_the_package_and_unknown_types():
    skeleton = '{"$dc": "subprocess:Popen", "f": {}}'
    with pytest.raises(ValueError, match="refusing"):
        wire.unpack({}, skeleton)
    with pytest.raises(TypeError, match="cannot send"):
        wire.pack({"x": object()})


def test_missing_extra_is_one_clear_line(monkeypatch):
    import sys
    from fedl2p_cli.engine import flower
    monkeypatch.setitem(sys.modules, "flwr", None)  # import flwr -> ImportError
    with pytest.raises(FedL2PError, match=r"pip install 'fedl2p\[flower\]'"):
        flower.require_flower()


def test_unknown_engine_is_refused(tiny_store):
    from fedl2p_cli.stages import meta_train
    cfg = meta_train.MetaTrainConfig(rounds=1, meta=TINY_META)
    with pytest.raises(USER_ERRORS, match="--engine"):
        meta_train.check(cfg, Runtime(engine="spark"))


@needs_flower
def test_flower_meta_train_matches_the_in_process_engine(tiny_store, tmp_path):
    """Same id; lambda and the per-round validation losses equal up to float32 rounding (the ClientApps run in Ray
    worker processes, whose float32 reductions differ from this process's by ~1 ulp: measured <= 3e-8 on lambda)."""
    from fedl2p_cli.stages import meta_train
    arts = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for engine in ("local", "flower"):
            root = tmp_path / engine
            shutil.copytree(tiny_store["store"].root, root)
            cfg = meta_train.MetaTrainConfig(rounds=2, fraction=0.5, seed=31, meta=TINY_META)
            arts[engine] = meta_train.run(cfg, Store(root), tiny_store["pretrain"].id, tiny_store["stats"].id,
                                          runtime=Runtime(engine=engine, workers=2))[0]
    finally:
        torch.set_num_threads(threads)
    a, b = arts["local"], arts["flower"]
    assert a.id == b.id
    la, lb = weights.load(a.file("lambda.safetensors")), weights.load(b.file("lambda.safetensors"))
    assert la.keys() == lb.keys()
    for k in la:
        torch.testing.assert_close(la[k], lb[k], rtol=0, atol=1e-6)
    va, vb = (b_.metrics["best_val_loss"] for b_ in (a, b))
    assert abs(va - vb) < 1e-6 and a.metrics["rounds_run"] == b.metrics["rounds_run"] == 2


@needs_flower
def test_flower_pretraining_matches_the_in_process_engine(tiny_store, tmp_path):
    from fedl2p_cli.stages import pretrain
    arts = []
    for engine in ("local", "flower"):
        store = Store(tmp_path / engine)
        store.root.mkdir(parents=True)
        shutil.copytree(tiny_store["store"].root / "partition", store.root / "partition")
        cfg = pretrain.PretrainConfig(**TINY_PRETRAIN)
        arts.append(pretrain.run(cfg, store, tiny_store["partition"].id, plot=False, runtime=Runtime(engine=engine))[0])
    assert arts[0].id == arts[1].id
    wa, wb = (weights.load(a.file("model.safetensors")) for a in arts)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=1e-5)


def _free_ports(n: int) -> list[int]:
    import socket
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _first_round_checkpointed(out, timeout: float = 240) -> int:
    """Wait until the ServerApp's checkpoint under OUT has at least one finished round; the rounds it has."""
    import time

    from fedl2p_cli.engine.loop import Checkpoint
    deadline, reached = time.time() + timeout, 0
    while time.time() < deadline and reached < 1:
        for folder in (out / ".checkpoint").glob("*"):
            try:
                st = Checkpoint(folder).load()
                reached = st.next_round if st else 0
            except Exception:  # noqa: BLE001 - caught mid-write: look again
                pass
        time.sleep(0.1)
    return reached


def _kill_serverapp_after_a_round(flwr_run: list[str], env: dict, out, link_pid: int) -> int:
    """Start `flwr run`, wait for the ServerApp's first round checkpoint, then kill -9 the ServerApp process (a child
    of the SuperLink's SuperExec, in the SuperLink's session) and `flwr run` itself; the round it had reached."""
    import os
    import signal
    import subprocess
    from pathlib import Path

    runner = subprocess.Popen(flwr_run, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    reached = _first_round_checkpointed(out)
    def cmdlines() -> dict[int, list[str]]:
        out = {}
        for p in Path("/proc").iterdir():
            try:
                if p.name.isdigit():
                    out[int(p.name)] = (p / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:  # a process that ended while we looked
                pass
        return out

    procs = cmdlines()
    # the SuperLink's SuperExec names its parent and the ServerAppIo address its ServerApps connect to
    addresses = {a[a.index("--runtime-api-address") + 1] for a in procs.values()
                 if any("flower-superexec" in x for x in a) and "--parent-pid" in a and "--runtime-api-address" in a
                 and a[a.index("--parent-pid") + 1] == str(link_pid)}
    apps = [pid for pid, a in procs.items() if any("flwr-serverapp" in x for x in a) and "--runtime-api-address" in a
            and a[a.index("--runtime-api-address") + 1] in addresses]
    for pid in apps:
        os.kill(pid, signal.SIGKILL)
    os.killpg(runner.pid, signal.SIGKILL)
    runner.wait(timeout=30)
    assert apps, "no ServerApp process found to kill"
    return reached


def _kill_a_site_after_a_round(flwr_run: list[str], env: dict, out, site):
    """Run `flwr run` to the end while the SuperNode `site` is killed (its process group) once round 1 is
    checkpointed; its completed process."""
    import os
    import signal
    import subprocess

    runner = subprocess.Popen(flwr_run, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    _first_round_checkpointed(out)
    os.killpg(site.pid, signal.SIGKILL)
    try:
        text, _ = runner.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(runner.pid, signal.SIGKILL)
        text, _ = runner.communicate()
    return subprocess.CompletedProcess(flwr_run, runner.returncode, text, "")


def _alive(pids: list[int]) -> list[int]:
    """Those of pids (and their process groups) still running, zombies excluded."""
    import subprocess
    out = subprocess.run(["ps", "-eo", "pid,pgid,stat"], capture_output=True, text=True).stdout.split("\n")[1:]
    rows = [ln.split() for ln in out if ln.strip()]
    return [int(p) for p, g, st in rows if (int(p) in pids or int(g) in pids) and not st.startswith("Z")]


@needs_flower
@pytest.mark.parametrize("mode", ["insecure", "tls-and-supernode-auth", "serverapp-killed", "site-nan", "site-shape",
                                  "site-scale100", "site-killed"])
def test_flower_deployment_on_loopback_matches_in_process(tiny_store, tmp_path, mode):
    """A real SuperLink and two SuperNodes on 127.0.0.1 (insecure, temporary FLWR_HOME, free ports, no runtime
    dependency installation), `flwr run` of the repo's app for two rounds; each site computes its own statistics.
    Lambda equals the in-process engine's on the same two clients (float32 rounding), and every process started
    (each in its own process group, with its children) is gone afterwards. Secured: TLS and SuperNode authentication,
    and an unregistered SuperNode is refused. Killed: the ServerApp process (and `flwr run`) killed after its first
    round's checkpoint; a second `flwr run` of the same run config resumes and ends at the same lambda."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import tomli_w

    from fedl2p_cli.engine.loop import group_of
    from fedl2p_cli.engine.rounds import in_process, run_rounds
    from fedl2p_cli.stages import flower_app, meta_train, partition
    from fedl2p_cli.stages.common import NoProgress

    secure, killed = mode == "tls-and-supernode-auth", mode == "serverapp-killed"
    fault = mode[len("site-"):] if mode.startswith("site-") else None  # a third site that misbehaves, or dies
    rounds = 4 if killed else 3 if fault == "killed" else 2
    store = tiny_store["store"]
    _, part = partition.load(store, tiny_store["partition"].id)
    sites = part.pool(False)[:3 if fault else 2]
    for c in sites:
        flower_app.export_site(part.client(c), c, tmp_path / f"site{c}")
    cfg = meta_train.MetaTrainConfig(rounds=rounds, fraction=1.0 if fault else 0.5, seed=31, keep="last", meta=TINY_META,
                                     norm_bound=3.0 if fault else 0.0)  # last: it moved
    rt = Runtime(round_timeout=60.0 if fault == "killed" else 0.0, min_answers=0.6 if fault == "killed" else 1.0)
    out = tmp_path / "out"
    (tmp_path / "run.toml").write_text(tomli_w.dumps(flower_app.run_config(store, tiny_store["pretrain"].id, cfg,
                                                                           len(sites), out, rt)))
    link, *nodes = _free_ports(len(sites) + 1)
    home = tmp_path / "flwr_home"
    home.mkdir()
    certs = tmp_path / "certs"
    if secure:  # the helper's test credentials: TLS for every connection, and only registered SuperNodes may join
        from fedl2p_cli.stages import flower_certs
        flower_certs.make(certs, 2, ["127.0.0.1", "localhost"])
    trust = f'root-certificates = "{certs / "ca.crt"}"\n' if secure else "insecure = true\n"
    (home / "config.toml").write_text(f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
                                      f'address = "127.0.0.1:{link}"\n{trust}')
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, FLWR_HOME=str(home), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    logs = [open(tmp_path / f"proc{i}.log", "w") for i in range(4)]
    started: list[subprocess.Popen] = []

    def start(args: list[str], log) -> None:
        started.append(subprocess.Popen([str(bin_dir / args[0]), *args[1:]], env=env, stdout=log, stderr=log,
                                        start_new_session=True))

    try:
        link_tls = (["--ssl-ca-certfile", str(certs / "ca.crt"), "--ssl-certfile", str(certs / "server.pem"),
                     "--ssl-keyfile", str(certs / "server.key"), "--enable-supernode-auth"] if secure else ["--insecure"])
        start(["flower-superlink", *link_tls, "--port", str(link), "--database", ":flwr-in-memory:",
               "--disable-runtime-dependency-installation"], logs[0])
        time.sleep(5)
        for i, (port, c, log) in enumerate(zip(nodes, sites, logs[1:]), 1):
            node_tls = ["--insecure"]
            if secure:
                reg = subprocess.run([str(bin_dir / "flwr"), "supernode", "register", str(certs / f"site{i}.pub"),
                                      "loopback"], env=env, capture_output=True, text=True, timeout=60)
                assert reg.returncode == 0, reg.stdout[-2000:] + reg.stderr[-2000:]
                node_tls = ["--root-certificates", str(certs / "ca.crt"),
                            "--auth-supernode-private-key", str(certs / f"site{i}.key")]
            spoil = f" fault='{fault}'" if fault in flower_app.FAULTS and i == 3 else ""
            start(["flower-supernode", *node_tls, "--superlink", f"127.0.0.1:{link}", "--port", str(port),
                   "--node-config", f"site-dir='{tmp_path / f'site{c}'}'{spoil}"], log)
        if secure:  # an intruder: the right CA and address, but not registered (without SuperNode authentication
            # the SuperLink would accept it; seen: "Activated node_id=...")
            start(["flower-supernode", "--root-certificates", str(certs / "ca.crt"),
                   "--superlink", f"127.0.0.1:{link}", "--port", str(_free_ports(1)[0]),
                   "--max-retries", "2", "--node-config", f"site-dir='{tmp_path / f'site{sites[0]}'}'"], logs[3])
        from fedl2p_cli.cli.main import run_cli
        app = tmp_path / "app"
        assert run_cli(["flower", "app", str(app)]) == 0  # the app as a deployment gets it: written out by fedl2p
        flwr_run = [str(bin_dir / "flwr"), "run", str(app), "loopback", "--run-config", str(tmp_path / "run.toml"), "--stream"]
        if killed:
            killed_at = _kill_serverapp_after_a_round(flwr_run, env, out, started[0].pid)
            assert 1 <= killed_at < rounds and not (out / "lambda.safetensors").exists()
        if fault == "killed":  # the third SuperNode dies (kill -9, its whole process group) after round 1
            r = _kill_a_site_after_a_round(flwr_run, env, out, started[3])
        else:
            r = subprocess.run(flwr_run, env=env, capture_output=True, text=True, timeout=300)
        assert (out / "lambda.safetensors").is_file(), r.stdout[-2000:] + r.stderr[-2000:]
        assert len((out / "history.csv").read_text().strip().splitlines()) == rounds + 1
        if killed:  # the second run did not start over: it resumed where the killed one's checkpoint was
            import re
            last = (out / "server.log").read_text().splitlines()[-1]
            assert re.search(r"resuming after round (\d+)", last) and killed_at <= int(re.search(r"(\d+)$", last).group(1)) < rounds, last
        history = (out / "history.csv").read_text()
        if fault == "killed":  # the run completed without it, and named it
            assert f"client {sites[2]}: " in history, history
        elif fault:  # every round dropped the third site's reply, named with its reason
            why = {"nan": "eta is not finite", "shape": "torch.float32", "scale100": "--norm-bound"}[fault]
            assert history.count(f"client {sites[2]}: ") == rounds and why in history, history
        if secure:  # the unregistered SuperNode was refused, and gave up
            refused = "All SuperNodes must be registered"
            deadline = time.time() + 120
            while refused not in (tmp_path / "proc3.log").read_text() and time.time() < deadline:
                time.sleep(2)
            assert refused in (tmp_path / "proc3.log").read_text()
    finally:
        for p in started:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in started:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        for log in logs:
            log.close()
        deadline = time.time() + 20
        while _alive([p.pid for p in started]) and time.time() < deadline:
            time.sleep(0.5)
        for pid in _alive([p.pid for p in started]):
            os.kill(pid, signal.SIGKILL)
    assert not _alive([p.pid for p in started])
    if fault == "killed":  # its first round aggregated three sites: no two-site reference to compare with
        return

    # the in-process engine on the same two clients, the statistics from the central stats stage
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ctx = meta_train.make_context(str(store.root), tiny_store["pretrain"].id, tiny_store["partition"].id,
                                      tiny_store["stats"].id, cfg, Runtime())
        lam0 = meta_train.initial_lambda(cfg, ctx.stats.xi.shape[1], ctx.stats.x.shape[1], len(ctx.theta_g))
        strategy = meta_train.MetaStrategy(ctx, lam0)
        strategy.seen = list(sites[:2])  # a misbehaving site's replies were dropped: lambda is the two others'
        st = run_rounds(strategy, rounds, None, NoProgress(), in_process(lambda t: meta_train.client_task(ctx, t)))
    finally:
        torch.set_num_threads(torch_threads)
    want = group_of(st.tensors, "lam")
    got = weights.load(out / "lambda.safetensors")
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-6)
    assert not torch.equal(want["bnnet.2.bias"], lam0["bnnet.2.bias"])  # a comparison of two learned lambdas



def test_a_site_that_errs_or_stays_silent_is_a_failed_client():
    """The replies to three messages: the first answers, the second reports an error, the third is missing; the
    last two become `rounds.Failed` (the round's policy decides what follows)."""
    from types import SimpleNamespace as NS

    from fedl2p_cli.engine import flower as fl
    from fedl2p_cli.engine.rounds import Failed

    def reply(i, error=None, content=None):
        return NS(metadata=NS(group_id=str(i)), has_error=lambda: error is not None, error=NS(reason=error),
                  content=content)

    import unittest.mock as um
    with um.patch.object(fl, "unrecord", lambda c: ("unpacked", c)):
        out = fl.collect([reply(1, error="out of memory"), reply(0, content="C")], 3, timeout=7.5)
    assert out[0] == ("unpacked", "C")
    assert out[1] == Failed("the site reported an error: out of memory")
    assert out[2] == Failed("no reply within 7.5 s")
