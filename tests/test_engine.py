"""The one round loop (engine/rounds.py) with a toy strategy: resume, early stop, divergence, and that every
federated stage runs through it."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from fedl2p_cli.catalog import META_GRAD
from fedl2p_cli.engine.loop import Checkpoint, LoopState, generator, group_of, nest
from fedl2p_cli.engine.rounds import Watch, in_process, run_rounds
from fedl2p_cli.runtime import EXECUTOR
from fedl2p_cli.stages.common import NoProgress

from .helpers import KillAfter, Killed, execute, handed


@dataclass
class Add:
    w: torch.Tensor
    round: int
    client: int


class Toy:
    """State: a running sum; each client adds a draw of its (seed, round, client) generator."""

    label = "toy"

    def __init__(self, stop_at: float = float("inf"), nan_round: int = -1):
        self.stop_at, self.nan_round = stop_at, nan_round

    def initial_state(self) -> LoopState:
        return LoopState(0, {"w": torch.zeros(3, dtype=torch.float64)})

    def stop(self, st: LoopState) -> bool:
        return float(st.tensors["w"].sum()) > self.stop_at

    def configure(self, st: LoopState, rnd: int) -> list[Add]:
        return [Add(st.tensors["w"], rnd, c) for c in range(3)]

    @staticmethod
    def client(t: Add):
        return t.w + torch.rand(3, generator=generator(0, t.round, t.client), dtype=torch.float64)

    def aggregate(self, st, rnd, tasks, results, timer):
        if rnd == self.nan_round:
            return None
        st.tensors["w"] = torch.stack(results).mean(0)
        return {"round": rnd + 1, "sum": float(st.tensors["w"].sum())}

    def progress_info(self, rec, st):
        return {}


def test_resume_after_a_kill_is_bit_identical(tmp_path):
    full = run_rounds(Toy(), 6, Checkpoint(tmp_path / "a"), NoProgress(), in_process(Toy.client))
    with pytest.raises(Killed):
        run_rounds(Toy(), 6, Checkpoint(tmp_path / "b"), KillAfter(4), in_process(Toy.client))
    assert Checkpoint(tmp_path / "b").load().next_round == 4
    again = run_rounds(Toy(), 6, Checkpoint(tmp_path / "b"), NoProgress(), in_process(Toy.client))
    assert torch.equal(full.tensors["w"], again.tensors["w"]) and [h["sum"] for h in full.history] == [h["sum"] for h in again.history]


@dataclass
class Recorder:
    """A round observer (a tracker's or a server log's signature) writing what it sees into `calls`."""
    calls: list
    name: str

    def start(self, label, rounds, done):
        self.calls.append((self.name, "start", label, rounds, done))

    def round(self, label, rec, st, shown):
        self.calls.append((self.name, "round", rec["round"], st.next_round))

    def stop(self):
        self.calls.append((self.name, "stop"))


@dataclass
class Bar:
    """A stage's progress bar."""
    calls: list

    def start(self, description, total):
        self.calls.append(("bar", "start", description, total))

    def advance(self, n=1, **info):
        self.calls.append(("bar", "advance", n))

    def stop(self):
        self.calls.append(("bar", "stop"))


def test_the_progress_bar_a_tracker_and_a_server_log_observe_one_list(tmp_path):
    """A stage's progress bar and a tracker its build opened (passed with the bar, as a Watch) see the same rounds in
    the same order; a server log given in the bar's place sees a resumed run start after the checkpoint's rounds."""
    calls: list = []
    run_rounds(Toy(), 2, Checkpoint(tmp_path / "c"), Watch(Bar(calls), (Recorder(calls, "tracker"),)),
               in_process(Toy.client))
    assert calls == [("bar", "start", "toy", 2), ("bar", "advance", 0), ("tracker", "start", "toy", 2, 0),
                     ("bar", "advance", 1), ("tracker", "round", 1, 1), ("bar", "advance", 1), ("tracker", "round", 2, 2),
                     ("bar", "stop"), ("tracker", "stop")]
    calls.clear()
    run_rounds(Toy(), 3, Checkpoint(tmp_path / "c"), Recorder(calls, "log"), in_process(Toy.client))
    assert calls == [("log", "start", "toy", 3, 2), ("log", "round", 3, 3), ("log", "stop")]


def test_stop_and_a_refused_round(tmp_path):
    st = run_rounds(Toy(stop_at=2.5), 50, None, NoProgress(), in_process(Toy.client))
    assert st.next_round < 50 and st.history[-1]["sum"] > 2.5 and st.history[-2]["sum"] <= 2.5
    ck = Checkpoint(tmp_path / "c")
    st = run_rounds(Toy(nan_round=2), 6, ck, NoProgress(), in_process(Toy.client))
    assert st.next_round == 2 and len(st.history) == 2 and ck.load().next_round == 2


def test_nested_state_round_trips():
    lam = {"bnnet.0.weight": torch.ones(2), "eta": torch.zeros(1)}
    flat = nest("lam", lam) | nest("best", {"eta": torch.ones(1)})
    assert group_of(flat, "lam").keys() == lam.keys() and group_of(flat, "best")["eta"].item() == 1
    assert group_of(flat, "opt") == {}


def test_federated_stages_run_through_the_engine():
    """No stage keeps its own round loop: every `range(...next_round...)` loop is in engine/rounds.py (L2P, which
    runs clients one after another without rounds, is the one per-client loop in stages/)."""
    pkg = Path(__file__).resolve().parent.parent / "fedl2p_cli"
    loops = []
    for f in sorted(pkg.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.For) and "next_round" in ast.unparse(node.iter) and "range" in ast.unparse(node.iter):
                loops.append(str(f.relative_to(pkg)))
    assert loops == ["engine/rounds.py"], loops


def _no_context():
    return None


def _die(_ctx, c):
    import os
    if c == 1:
        os._exit(3)  # a worker killed mid-round (out of memory, kill -9)
    return c


def _slow_start():
    import time
    time.sleep(3)  # a worker whose start-up (importing torch, reading the store) takes longer than a round's timeout
    return None


def _echo(_ctx, c):
    return c


def _slow(_ctx, c):
    import time
    if c == 1:
        time.sleep(120)  # a client that never answers in time
    return c


def test_a_worker_process_that_dies_is_a_failed_client_and_the_pool_starts_afresh():
    import time

    from fedl2p_cli.engine.rounds import Failed
    from fedl2p_cli.engine.workers import ClientPool
    t0 = time.time()
    with ClientPool(2, _no_context, (), _die, None, torch.device("cpu")) as pool:
        assert pool.map([0, 2]) == [0, 2]
        out = pool.map([0, 1, 2])
        assert isinstance(out[1], Failed) and "worker process died" in out[1].reason
        assert all(r in (0, 2) or isinstance(r, Failed) for r in out)  # the others of the broken pool may fail too
        assert pool.map([0, 2]) == [0, 2]  # a fresh pool: the run goes on
    assert time.time() - t0 < 120


def test_a_client_without_a_reply_within_the_timeout_is_a_failed_client():
    import time

    from fedl2p_cli.engine.rounds import Failed
    from fedl2p_cli.engine.workers import ClientPool
    t0 = time.time()
    with ClientPool(2, _no_context, (), _slow, None, torch.device("cpu"), timeout=5.0) as pool:
        assert pool.map([0, 2]) == [0, 2]  # the workers have started (the first round includes their start-up)
        out = pool.map([0, 1, 2])
        assert out[0] == 0 and out[2] == 2 and isinstance(out[1], Failed) and "no reply within 5 s" in out[1].reason
        assert pool.map([0, 2]) == [0, 2]
    assert time.time() - t0 < 90  # the hung worker (120 s) was not waited for


def test_a_round_s_timeout_does_not_count_the_workers_start_up():
    """The pool starts its workers (and their context) before any round: clients that answer at once are not failed
    because their workers took longer than --round-timeout to start, neither at first nor after a restart."""
    from fedl2p_cli.engine.workers import ClientPool
    with ClientPool(2, _slow_start, (), _echo, None, torch.device("cpu"), timeout=2.0) as pool:
        assert pool.map([0, 1, 2]) == [0, 1, 2]
        pool.close()
        pool.pool = pool._start()  # as after a hung or dead worker
        assert pool.map([3, 4]) == [3, 4]


def test_each_client_draws_its_own_batch_stream():
    """Mutation pin: with the client index dropped from the seed (engine/loop.py), every client of a seed would see
    the same batch order, and round draws of two clients would be the same."""
    from fedl2p_cli.engine.loop import batch_stream
    perms = [torch.randperm(64, generator=batch_stream(0, c)) for c in range(4)]
    assert all(not torch.equal(perms[0], p) for p in perms[1:])
    assert torch.equal(perms[2], torch.randperm(64, generator=batch_stream(0, 2)))  # the same client: the same stream
    assert not torch.equal(torch.randperm(64, generator=batch_stream(1, 2)), perms[2])  # another seed: another stream
    draws = [torch.rand(8, generator=generator(0, 3, c)) for c in range(3)]
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])


def test_an_executor_is_one_registration_and_gives_the_same_artifact(tiny_store, tmp_path):
    """A plugin's executor (here: a round's tasks run in reverse order, results given back in task order) is chosen
    by --engine through the catalog, like the built-ins; its pretrained model is bit for bit the local one's, and an
    unknown --engine is one line naming the choices."""
    import shutil

    from fedl2p_cli import plugins
    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.engine.executors import Job, Local
    from fedl2p_cli.errors import FedL2PError
    from fedl2p_cli.runtime import Runtime
    from fedl2p_cli.stages import pretrain
    from fedl2p_cli.stages.interface import Inputs, StageContext, run_stage

    from .conftest import TINY_PRETRAIN

    opened = []

    class Reversed:
        name, about = "reversed", "a test's executor: tasks in reverse order"

        def check(self, runtime):
            pass

        def open(self, job: Job):
            inner = Local().open(job)
            opened.append(job.nodes)

            class P:
                def map(self, tasks):
                    return inner.map(tasks[::-1])[::-1]

                def close(self):
                    inner.close()

                def __enter__(self):
                    return self

                def __exit__(self, *exc):
                    self.close()
            return P()

    shutil.copytree(tiny_store["store"].root, tmp_path / "s")
    store = Store(tmp_path / "s")
    part = tiny_store["partition"].id
    cfg = pretrain.PretrainConfig(**TINY_PRETRAIN | {"seed": 3})
    local, _ = execute(pretrain, cfg, store, {"partition": part}, plot=False)
    # the catalog travels with the runtime: the stage interface looks the executor up in it
    ctx = StageContext(store, Runtime(engine="reversed", catalog=plugins.build(lambda registry: registry.add_executor(Reversed()))),
                       force=True, plot=False)
    other, _ = run_stage(pretrain, cfg, Inputs.given({"partition": part}), ctx)
    assert plugins.current().find(EXECUTOR, "reversed") is None  # ... and in no other catalog
    assert opened and other.id == local.id
    assert other.file("model.safetensors").read_bytes() == local.file("model.safetensors").read_bytes()
    with pytest.raises(FedL2PError, match="unknown executor 'nope' \\(--engine\\); choose one of: local, flower"):
        execute(pretrain, cfg, store, {"partition": part}, force=True, plot=False, runtime=Runtime(engine="nope"))


def test_a_meta_gradient_is_one_registration_and_names_its_variant(tiny_store, tmp_path):
    """A plugin's meta-gradient (here: FOMAML+ at half its size) is chosen by --meta-grad through the catalog, like the
    built-ins: its runs go through both client-update paths (one at a time and the batched executor's `many`), its
    variant name carries its own name, its lambda differs from FOMAML+'s, and an unknown name is one line naming the
    choices."""
    import dataclasses
    import shutil

    from fedl2p_cli import plugins
    from fedl2p_cli.api import Fomaml
    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.errors import FedL2PError
    from fedl2p_cli.io import weights
    from fedl2p_cli.runtime import Runtime
    from fedl2p_cli.stages import meta_train
    from fedl2p_cli.stages.interface import Inputs, StageContext, run_stage

    from .conftest import TINY_META

    calls = []

    def halved(mg):
        return dataclasses.replace(mg, grads={k: g / 2 for k, g in mg.grads.items()})

    @dataclasses.dataclass(frozen=True)
    class Half:
        name: str = "half-fomaml"
        about: str = "a test's meta-gradient: FOMAML+ halved"

        def one(self, *args):
            calls.append("one")
            return halved(Fomaml().one(*args))

        def many(self, *args):
            calls.append("many")
            return [halved(mg) for mg in Fomaml().many(*args)]

    shutil.copytree(tiny_store["store"].root, tmp_path / "s")
    store = Store(tmp_path / "s")
    ids = tiny_store["pretrain"].id, tiny_store["stats"].id
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=1, fraction=0.5, keep="last",
                                     meta=dataclasses.replace(TINY_META, meta_grad="fomaml"))
    fomaml, _ = run_stage(meta_train, cfg, Inputs.given({"pretrain": ids[0], "stats": ids[1]}), StageContext(store, handed()))
    mine = dataclasses.replace(cfg, meta=dataclasses.replace(cfg.meta, meta_grad="half-fomaml"))
    assert mine.variant().startswith("fedl2p-half-fomaml")
    catalog = plugins.build(lambda registry: registry.add_meta_grad(Half()))  # travels with the runtime
    inputs = Inputs.given({"pretrain": ids[0], "stats": ids[1]})
    one, _ = run_stage(meta_train, mine, inputs, StageContext(store, Runtime(catalog=catalog)))
    many, _ = run_stage(meta_train, mine, inputs, StageContext(store, Runtime(engine="batched", client_batch=4,
                                                                             catalog=catalog), force=True))
    assert plugins.current().find(META_GRAD, "half-fomaml") is None
    assert {"one", "many"} <= set(calls) and one.id == many.id != fomaml.id
    assert one.manifest.get("plugins") and not fomaml.manifest.get("plugins")  # the artifact names the plugin
    lam_f, lam_h = weights.load(fomaml.file("lambda.safetensors")), weights.load(one.file("lambda.safetensors"))
    assert any(not torch.equal(lam_f[k], lam_h[k]) for k in lam_f)
    with pytest.raises(FedL2PError, match="unknown meta-gradient 'half-fomaml' \\(--meta-grad\\); choose one of: fomaml, ift"):
        run_stage(meta_train, mine, inputs, StageContext(store, handed(), force=True))
