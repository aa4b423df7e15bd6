"""Rounds that survive their clients (engine.rounds.RoundPolicy): a round aggregates the clients that answered when
enough did, names the others in its record, samples the round afresh when too few did, and stops with one line when
retries run out. The same loop runs every engine; the executors' side (dead workers, timeouts) is in test_engine."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from fedl2p_cli.core.client import Timer
from fedl2p_cli.engine.loop import LoopState, sample_clients
from fedl2p_cli.engine.rounds import Failed, RoundPolicy, run_rounds
from fedl2p_cli.engine.workers import ClientPool
from fedl2p_cli.errors import FedL2PError
from fedl2p_cli.stages import meta_train
from fedl2p_cli.stages.common import NoProgress

from .conftest import TINY_META
from .helpers import handed

POOL = list(range(10))


@dataclass
class Ask:
    client: int
    round: int


class Sum:
    """A strategy whose state is the sum of the answering clients' ids: what was aggregated is visible."""
    label = "sum"

    def __init__(self):
        self.samples: list[list[int]] = []

    def initial_state(self) -> LoopState:
        return LoopState(0, {}, extra={"sum": 0})

    def stop(self, st):
        return False

    def configure(self, st, rnd, attempt=0):
        clients = sample_clients(POOL, 0.4, 0, rnd, attempt)
        self.samples.append(clients)
        return [Ask(c, rnd) for c in clients]

    def aggregate(self, st, rnd, tasks, results, timer):
        st.extra["sum"] += sum(results)
        return {"round": rnd + 1, "answered": len(results)}

    def progress_info(self, rec, st):
        return {}


def failing(bad):
    """An executor for which the clients `bad(client, rnd)` fail."""
    return lambda tasks: [Failed("site offline") if bad(t.client, t.round) else t.client for t in tasks]


def test_enough_answers_aggregate_what_arrived_and_name_the_rest():
    s = Sum()
    first = sample_clients(POOL, 0.4, 0, 0)
    st = run_rounds(s, 1, None, NoProgress(), failing(lambda c, r: c == first[0]), RoundPolicy(min_answers=0.7))
    assert st.extra["sum"] == sum(first[1:]) and st.history[0]["answered"] == len(first) - 1
    assert st.history[0]["failed"] == f"client {first[0]}: site offline"


def test_too_few_answers_stop_with_one_line_by_default():
    with pytest.raises(FedL2PError, match=r"round 1: too few clients answered \(at least 4 of 4 needed.*site offline"):
        run_rounds(Sum(), 1, None, NoProgress(), failing(lambda c, r: c % 2 == 0 or c == 1), RoundPolicy())


def test_a_retry_samples_the_round_afresh_and_records_the_failed_attempt():
    s = Sum()
    first = set(sample_clients(POOL, 0.4, 0, 0))
    st = run_rounds(s, 1, None, NoProgress(), failing(lambda c, r: c in first), RoundPolicy(min_answers=0.5, retries=5))
    assert s.samples[0] == sorted(first) and len(s.samples) >= 2 and s.samples[1] != s.samples[0]  # drawn afresh
    last = [c for c in s.samples[-1] if c not in first]
    assert len(last) >= 2 and st.extra["sum"] == sum(last)
    assert st.history[0]["failed"].count("site offline") == sum(len(first & set(x)) for x in s.samples)


def test_retries_run_out():
    with pytest.raises(FedL2PError, match=r"in 3 attempt\(s\)"):
        run_rounds(Sum(), 1, None, NoProgress(), failing(lambda c, r: True), RoundPolicy(min_answers=0.5, retries=2))


def _dies_for_client_2(ctx, task):
    import os
    if task.client == 2:
        os._exit(9)
    return meta_train.client_task(ctx, task)


def test_meta_train_goes_on_without_a_dead_worker_and_names_it(tiny_store):
    """Real worker processes: client 2's dies mid-round; with --min-answers 0.5 the round aggregates the others
    (the same lambda as a round without client 2) and history names client 2."""
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=1, fraction=1.0, meta=TINY_META)
    rt = handed(min_answers=0.5, workers=2)
    ids = (str(tiny_store["store"].root), tiny_store["pretrain"].id, tiny_store["partition"].id, tiny_store["stats"].id)
    ctx = meta_train.make_context(*ids, cfg, rt)
    lam0 = meta_train.initial_lambda(cfg, ctx.entries.head, ctx.stats.xi.shape[1], ctx.stats.x.shape[1], len(ctx.theta_g))
    seen = ctx.part.pool(False)
    assert 2 in seen
    with ClientPool(2, meta_train.make_context, (*ids, cfg, rt), _dies_for_client_2, ctx, rt.torch_device) as pool:
        strategy = meta_train.MetaStrategy(ctx, lam0)
        st = run_rounds(strategy, 1, None, NoProgress(), pool.map, rt.policy())
    rec = st.history[0]
    assert "client 2: its worker process died" in rec["failed"]
    failed = {int(part.split(":")[0].split()[1]) for part in rec["failed"].split("; ")}
    assert rec["sampled"] == " ".join(map(str, seen))  # every sampled client, the failed one too
    ref = meta_train.MetaStrategy(ctx, lam0)
    st_ref = ref.initial_state()
    tasks = [t for t in ref.configure(st_ref, 0) if t.client not in failed]
    ref.aggregate(st_ref, 0, tasks, [meta_train.client_task(ctx, t) for t in tasks], Timer())
    for k, v in st_ref.tensors.items():
        assert (st.tensors[k] - v).abs().max() < 1e-6, k
