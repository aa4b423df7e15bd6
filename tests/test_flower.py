"""The Flower engine: the wire format (always), and `--engine flower` against the in-process engine (only where the
optional extra is installed: `make test-flower` builds a venv with it)."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import shutil
import subprocess

import pytest
import torch

from fedl2p_cli.algorithms.fedl2p import ClientResult
from fedl2p_cli.artifacts import Store
from fedl2p_cli.errors import USER_ERRORS, FedL2PError
from fedl2p_cli.flower import wire
from fedl2p_cli.io import weights
from fedl2p_cli.runtime import Runtime
from fedl2p_cli.stages.meta_train import MetaReply, MetaTask

from .conftest import TINY_META, TINY_PRETRAIN
from .helpers import execute, handed

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
        back = wire.unpack({k: v.clone() for k, v in tensors.items()}, skeleton, ())
        assert _same(obj, back)
    assert type(wire.unpack(*wire.pack((1, 2)), ())) is tuple and type(wire.unpack(*wire.pack([1, 2]), ())) is list


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
        wire.unpack({}, skeleton, ())
    with pytest.raises(TypeError, match="cannot send"):
        wire.pack({"x": object()})


def test_wire_rebuilds_a_loaded_plugins_dataclass_and_imports_nothing():
    """A pFL system's task (a dataclass of its plugin's package) crosses a Flower message only where that plugin is
    loaded and the module already imported: a message can make no process import anything."""
    from fedl2p_cli import plugins

    from .toy_system import Ask
    tensors, skeleton = wire.pack(Ask(3, {"w": torch.arange(3.0)}, 1))
    with pytest.raises(ValueError, match="refusing"):
        wire.unpack(tensors, skeleton, wire.plugin_roots(plugins.current()))  # `tests` is no loaded plugin here
    roots = wire.plugin_roots(plugins.build("tests.test_systems"))  # the receiver's catalog, handed over
    assert roots == {"tests"}
    got = wire.unpack(tensors, skeleton, roots)
    assert got == Ask(3, got.state, 1) and torch.equal(got.state["w"], torch.arange(3.0))
    never = skeleton.replace("tests.toy_system:", "tests.not_imported:")  # the plugin's package: still refused,
    with pytest.raises(ValueError, match="refusing"):  # not a ModuleNotFoundError (no import tried)
        wire.unpack(tensors, never, roots)


def test_missing_extra_is_one_clear_line(monkeypatch):
    import sys

    from fedl2p_cli.flower import simulation as flower
    monkeypatch.setitem(sys.modules, "flwr", None)  # import flwr -> ImportError
    with pytest.raises(FedL2PError, match=r"pip install 'fedl2p\[flower\]'"):
        flower.require_flower()


def test_unknown_engine_is_refused(tiny_store):
    from fedl2p_cli.stages import meta_train
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=1, meta=TINY_META)
    with pytest.raises(USER_ERRORS, match="--engine"):
        meta_train.check(cfg, handed(engine="spark"))


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
            cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5, seed=31, meta=TINY_META)
            arts[engine] = execute(meta_train, cfg, Store(root),
                                   {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id},
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
        arts.append(execute(pretrain, cfg, store, {"partition": tiny_store["partition"].id}, plot=False, runtime=Runtime(engine=engine))[0])
    assert arts[0].id == arts[1].id
    wa, wb = (weights.load(a.file("model.safetensors")) for a in arts)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=1e-5)


def _checkpointed(out, timeout: float = 300) -> int:
    """Wait until the ServerApp's checkpoint under OUT has at least one finished round; the rounds it has."""
    import contextlib
    import time

    from fedl2p_cli.engine.loop import Checkpoint
    from fedl2p_cli.io import weights
    deadline, reached = time.time() + timeout, 0
    while time.time() < deadline and reached < 1:
        for folder in (out / ".checkpoint").glob("*"):
            path = folder / Checkpoint.NAME  # the published file only: `load` would delete the ServerApp's write in flight
            with contextlib.suppress(Exception):  # gone between the check and the read: look again
                reached = weights.load_with_meta(path)[1]["next_round"] if path.is_file() else 0
        time.sleep(0.1)
    return reached


def _crash_after_a_round(fed, run_cmd: list[str], out, *victims: str) -> int:
    """Start `run_cmd`, wait for the ServerApp's first round checkpoint, then kill -9 its ServerApp processes, the
    named processes (each with its process group) and the runner; the round the checkpoint had reached."""
    import os
    import signal
    import subprocess

    runner = subprocess.Popen(run_cmd, env=fed.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    reached = _checkpointed(out)
    apps = fed.serverapps()
    for pid in apps:
        os.kill(pid, signal.SIGKILL)
    for name in victims:
        fed.kill(name)
    os.killpg(runner.pid, signal.SIGKILL)
    runner.wait(timeout=30)
    assert apps, "no ServerApp process found to kill"
    return reached


def _run_killing_a_site(fed, run_cmd: list[str], out, site: str) -> subprocess.CompletedProcess:
    """Run `run_cmd` to its end while SuperNode `site` is killed (its process group) once round 1 is checkpointed."""
    import os
    import signal
    import subprocess

    runner = subprocess.Popen(run_cmd, env=fed.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    _checkpointed(out)
    fed.kill(site)
    try:
        text, err = runner.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(runner.pid, signal.SIGKILL)
        text, err = runner.communicate()
    return subprocess.CompletedProcess(run_cmd, runner.returncode, text, err)


MODES = ["insecure", "tls-auth-gateway", "tls-auth-nginx", "serverapp-killed", "superlink-restarted", "site-nan", "site-shape",
         "site-scale100", "site-killed", "site-lost-below-min-answers"]


@needs_flower
@pytest.mark.parametrize("mode", MODES)
def test_flower_deployment_on_loopback_matches_in_process(tiny_store, tmp_path, mode):
    """A real SuperLink and SuperNodes on 127.0.0.1 (temporary FLWR_HOME, free ports, no runtime dependency
    installation), `fedl2p flower run` of the repo's app; each site computes its own statistics and is named by its
    node-config site-name. Lambda equals the in-process engine's on the same clients (float32 rounding), and every
    process started is gone afterwards.
    tls-auth-gateway (the documented setup): TLS, SuperNode authentication, the SuperLink on loopback and the sites
    reaching it through `fedl2p flower gateway`; a key registration or run listing through the sites' address is
    refused, an unregistered SuperNode is refused, the registered ones train. tls-auth-nginx: the same through nginx
    from `fedl2p flower edge --nginx` (skipped where nginx is not installed, and unless FEDL2P_NGINX_DEPLOYMENT=1).
    serverapp-killed: the ServerApp killed after its first round; the next run resumes. superlink-restarted: the
    SuperLink (with --database) and its ServerApp killed after a round and restarted on the same database; the
    sites reconnect without being registered again and the next run resumes. site-*: a third site spoils its replies
    (the test-only rehearsal app) and is dropped every round, or dies after round 1 and the run completes without it
    (--min-answers 0.6), or dies and the run fails (--min-answers 1): exit 1 with the reason, history.csv holding
    the round before."""
    import subprocess

    import tomli_w

    from fedl2p_cli.engine.loop import group_of
    from fedl2p_cli.engine.rounds import in_process, run_rounds
    from fedl2p_cli.flower import app as flower_app
    from fedl2p_cli.stages import meta_train, partition
    from fedl2p_cli.stages.common import NoProgress

    from .flower_loopback import REPO, Loopback

    if mode == "tls-auth-nginx" and not (shutil.which("nginx") or os.path.exists("/usr/sbin/nginx")):
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    if mode == "tls-auth-nginx" and not os.environ.get("FEDL2P_NGINX_DEPLOYMENT"):  # ~2.5 min on 2 shared cores
        pytest.skip("the deployment through nginx runs with FEDL2P_NGINX_DEPLOYMENT=1 (CI's time budget)")
    secure = mode in ("tls-auth-gateway", "tls-auth-nginx", "superlink-restarted")
    killed, restarted, below = mode == "serverapp-killed", mode == "superlink-restarted", mode == "site-lost-below-min-answers"
    fault = mode[len("site-"):] if mode.startswith("site-") and not below else None  # a third site
    rounds = 4 if killed else 3 if fault == "killed" or below else 2
    store = tiny_store["store"]
    _, part = partition.load(store, tiny_store["partition"].id)
    sites = part.pool(False)[:3 if fault else 2]
    names = {c: f"hospital-{'abc'[i]}" for i, c in enumerate(sites)}  # what the operator knows the sites by
    for c in sites:
        flower_app.export_site(part.client(c), c, tmp_path / f"site{c}")
    lost = fault == "killed" or below
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=rounds, fraction=1.0 if fault or below else 0.5, seed=31, keep="last",
                                     meta=TINY_META, norm_bound=3.0 if fault else 0.0)  # last: it moved
    rt = handed(round_timeout=60.0 if lost else 0.0, min_answers=0.6 if fault == "killed" else 1.0)
    out = tmp_path / "out"
    out.mkdir()
    extra = mode == "tls-auth-gateway"  # a registered node that is not one of the run's sites
    (out / "run.toml").write_text(tomli_w.dumps(flower_app.run_config(
        store, tiny_store["pretrain"].id, cfg, len(sites), out, rt, [names[c] for c in sites] if extra else None)))
    edge = "nginx" if mode == "tls-auth-nginx" else secure
    fed = Loopback(tmp_path, secure, gateway=edge, database=tmp_path / "state.db" if restarted else None, sites=4)
    app = REPO / ("tests/flower_rehearsal" if fault in ("nan", "shape", "scale100") else "fedl2p_cli/flower/project")
    run_cmd = [str(fed.bin / "fedl2p"), "flower", "run", str(out), "--app", str(app), "--connection", "loopback"]
    try:
        fed.start_link()
        for i, c in enumerate(sites, 1):
            if secure:  # the operator registers each site's public key on the SuperLink's own (loopback) address
                reg = fed.register(i)
                assert reg.returncode == 0, reg.stdout[-2000:] + reg.stderr[-2000:]
            spoil = f" fault='{fault}'" if fault in ("nan", "shape", "scale100") and i == 3 else ""
            fed.start_node(i, tmp_path / f"site{c}", names[c], spoil)
        if secure:
            # a stranger with the CA reaches only the sites' address: no key registration, no run listing there
            reg, ls = fed.register(3, via="sites-address"), fed.flwr("ls", "sites-address")
            assert reg.returncode != 0 and "404" in reg.stdout + reg.stderr, reg.stdout[-2000:] + reg.stderr[-2000:]
            assert ls.returncode != 0 or "404" in ls.stdout + ls.stderr, ls.stdout[-2000:]
            # nor through any spelling of a path around the Fleet API (tests/test_gateway.py has the whole list)
            for target in (b"/v1/fleet/../control/register-node", b"/v1/fleet/%2e%2e/control/list-runs",
                           b"http://x/v1/fleet/../control/stop-run", b"/v1/fleet/register-node"):
                assert _through_gateway(fed, target) in (400, 404), target
            # and an unregistered SuperNode (the right CA and address, no registered key) is refused
            fed.start_node(9, tmp_path / f"site{sites[0]}", "intruder", key=4, retries=2)
        if extra:  # registered by the operator, but not named in the run config's site names: never sampled
            other = part.pool(False)[2]
            flower_app.export_site(part.client(other), other, tmp_path / f"site{other}")
            assert fed.register(3).returncode == 0
            fed.start_node(3, tmp_path / f"site{other}", "hospital-x")
        if killed or restarted:
            reached = _crash_after_a_round(fed, run_cmd, out, *(["superlink"] if restarted else []))
            assert 1 <= reached < rounds and not (out / "lambda.safetensors").exists()
            if restarted:  # on the same database: the sites' registrations survived, no one registers again
                fed.start_link()
        if fault == "killed" or below:  # the last SuperNode dies (kill -9, its process group) after round 1
            r = _run_killing_a_site(fed, run_cmd, out, f"node{len(sites)}")
        else:
            r = subprocess.run(run_cmd, env=fed.env, capture_output=True, text=True, timeout=400)
        history = (out / "history.csv").read_text()
        if below:  # the run failed the policy: exit 1 with the reason; the round before it is in history.csv
            last = r.stderr.strip().splitlines()[-1]  # the command's own last word, after flwr's
            assert r.returncode == 1 and last.startswith("run failed: round 2: too few clients answered"), r.stderr[-2000:]
            assert f"{names[sites[-1]]}: " in last, last
            assert "Traceback" not in r.stdout + r.stderr, r.stdout[-3000:]  # the reason, not the ServerApp's frames
            assert len(history.strip().splitlines()) == 2 and not (out / "lambda.safetensors").exists(), history
            assert "run failed: round 2: too few" in (out / "server.log").read_text()
            return
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert (out / "lambda.safetensors").is_file()
        assert len(history.strip().splitlines()) == rounds + 1
        log = (out / "server.log").read_text()
        assert f"round {rounds}/{rounds}: sampled" in r.stdout and f"round {rounds}/{rounds}: sampled" in log, log
        if killed or restarted:  # the second run did not start over: it resumed where the killed one's checkpoint was
            import re
            starts = [ln for ln in log.splitlines() if " run of " in ln]
            m = re.search(r"resuming after round (\d+)$", starts[-1])
            assert m and reached <= int(m.group(1)) < rounds, starts
        assert "client " not in history.replace("clients", ""), history  # sites by name, never by partition id
        if fault == "killed":  # the run completed without it, and named it
            assert f"{names[sites[2]]}: " in history, history
        elif fault:  # every round dropped the third site's reply, named with its reason
            why = {"nan": "eta is not finite", "shape": "torch.float32", "scale100": "--norm-bound"}[fault]
            assert history.count(f"{names[sites[2]]}: ") == rounds and why in history, history
        if extra:
            assert "(site 'hospital-x', client" in log and "not one of the run's sites" in log, log
            assert "hospital-x" not in history, history
            access = fed.log("gateway").read_text()
            assert " POST /v1/fleet/pull-messages 200 " in access and "Traceback" not in access, access[-2000:]
            assert " /v1/fleet/../control/register-node 404 " in access, access[-2000:]
        if secure:  # the unregistered SuperNode was refused (Flower's exit code 305), and gave up
            intruder = fed.procs["node9"]
            assert intruder.wait(timeout=120) != 0, fed.log("node9").read_text()[-2000:]
            assert "Failed to activate SuperNode" in fed.log("node9").read_text()
    finally:
        fed.close()
    if fault == "killed":  # its first round aggregated three sites: no two-site reference to compare with
        return

    # the in-process engine on the same two clients, the statistics from the central stats stage
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ctx = meta_train.make_context(str(store.root), tiny_store["pretrain"].id, tiny_store["partition"].id,
                                      tiny_store["stats"].id, cfg, handed())
        lam0 = meta_train.initial_lambda(cfg, ctx.entries.head, ctx.stats.xi.shape[1], ctx.stats.x.shape[1], len(ctx.theta_g))
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


def _through_gateway(fed, target: bytes) -> int:
    """The status the gateway answers a stranger (who holds the public CA) for one raw request."""
    import socket
    import ssl

    from .gateway_attacks import request
    ctx = ssl.create_default_context(cafile=str(fed.certs / "ca.crt"))
    with socket.create_connection(("127.0.0.1", fed.fleet), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        s.sendall(request(target))
        reply = s.recv(4096)
    return int(reply.split(b" ", 2)[1])


def test_a_site_that_errs_or_stays_silent_is_a_failed_client():
    """The replies to three messages: the first answers, the second reports an error, the third is missing; the
    last two become `rounds.Failed` (the round's policy decides what follows)."""
    from types import SimpleNamespace as NS

    from fedl2p_cli.engine.rounds import Failed
    from fedl2p_cli.flower import simulation as fl

    def reply(i, error=None, content=None):
        return NS(metadata=NS(group_id=str(i)), has_error=lambda: error is not None, error=NS(reason=error),
                  content=content)

    import unittest.mock as um
    with um.patch.object(fl, "unrecord", lambda c, roots: ("unpacked", c)):
        out = fl.collect([reply(1, error="out of memory"), reply(0, content="C")], 3, (), timeout=7.5)
    assert out[0] == ("unpacked", "C")
    assert out[1] == Failed("the site reported an error: out of memory")
    assert out[2] == Failed("no reply within 7.5 s")


@pytest.mark.skipif(importlib.util.find_spec("cryptography") is None, reason="needs the flower extra (cryptography)")
def test_credentials_are_private_and_a_git_work_tree_is_named(tmp_path, capsys):
    """Private keys owner-only in an owner-only folder; a site's own key pair; a warning inside a git work tree (and
    none outside one)."""
    import os
    import stat
    import subprocess

    from fedl2p_cli.cli.main import run_cli

    repo = tmp_path / "clone"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    assert run_cli(["flower", "credentials", "--out", str(repo / "creds"), "--sites", "2"]) == 0
    err = capsys.readouterr().err
    assert "inside the git work tree" in err and "does NOT ignore" in err, err
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)  # noqa: E731
    assert mode(repo / "creds") == 0o700
    for name in ("server.key", "site1.key", "site2.key"):
        assert mode(repo / "creds" / name) == 0o600, name
    assert mode(repo / "creds" / "site1.pub") == 0o644
    outside = tmp_path / "keys"
    assert run_cli(["flower", "keygen", "--out", str(outside), "--name", "hospital-a"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert mode(outside / "hospital-a.key") == 0o600 and mode(outside) == 0o700
    assert (outside / "hospital-a.pub").read_text().startswith("ecdsa-sha2-nistp384 ")
    assert "PRIVATE KEY" in (outside / "hospital-a.key").read_text()
