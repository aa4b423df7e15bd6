"""Untrusted replies in meta-training (in-process; the Flower deployment runs the same MetaStrategy): a reply with
non-finite values, other shapes or tensors, an impossible sample count, or (with --norm-bound) an update far larger
than the round's others is dropped and named in the round's record, never aggregated; --aggregate median and
trimmed-mean are coordinate-wise."""

from dataclasses import replace

import pytest
import torch

from fedl2p_cli.core.aggregate import reject_reason, robust_average
from fedl2p_cli.core.client import Timer
from fedl2p_cli.engine.loop import group_of
from fedl2p_cli.errors import FedL2PError
from fedl2p_cli.stages import meta_train

from .conftest import TINY_META
from .helpers import handed


@pytest.fixture(scope="module")
def round0(tiny_store):
    """A strategy on the tiny store, round 0's tasks and its clients' real replies."""
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=1, fraction=1.0, meta=TINY_META, norm_bound=3.0)
    ids = (str(tiny_store["store"].root), tiny_store["pretrain"].id, tiny_store["partition"].id, tiny_store["stats"].id)
    ctx = meta_train.make_context(*ids, cfg, handed())
    lam0 = meta_train.initial_lambda(cfg, ctx.entries.head, ctx.stats.xi.shape[1], ctx.stats.x.shape[1], len(ctx.theta_g))
    strategy = meta_train.MetaStrategy(ctx, lam0)
    st = strategy.initial_state()
    tasks = strategy.configure(st, 0)
    done = [meta_train.client_task(ctx, t) for t in tasks]
    return strategy, tasks, done


def aggregate(strategy, tasks, done):
    st = strategy.initial_state()
    rec = strategy.aggregate(st, 0, tasks, done, Timer())
    return rec, group_of(st.tensors, "lam")


def spoil(done, i, how):
    """Client i's reply, spoiled."""
    r = done[i].result
    if how == "nan":
        lam = dict(r.lam, **{"eta": torch.full_like(r.lam["eta"], float("nan"))})
    elif how == "shape":
        lam = dict(r.lam, **{"bnnet.0.weight": r.lam["bnnet.0.weight"][:, :1]})
    elif how == "missing":
        lam = {k: v for k, v in r.lam.items() if k != "eta"}
    elif how == "samples":
        return done[:i] + [replace(done[i], result=replace(r, n=10**6))] + done[i + 1:]
    return done[:i] + [replace(done[i], result=replace(r, lam=lam))] + done[i + 1:]


@pytest.mark.parametrize("how, reason", [("nan", "eta is not finite"), ("shape", "bnnet.0.weight is torch.float32 (100, 1)"),
                                         ("missing", "tensors missing eta"), ("samples", "claims 1000000 samples"),
                                         ("scaled", "> ")])
def test_a_bad_reply_is_dropped_named_and_not_aggregated(round0, how, reason):
    strategy, tasks, done = round0
    i = 1
    if how == "scaled":
        sent, r = tasks[i].lam, done[i].result
        big = {k: sent[k] + 100 * (v - sent[k]) for k, v in r.lam.items()}
        bad = done[:i] + [replace(done[i], result=replace(r, lam=big))] + done[i + 1:]
    else:
        bad = spoil(done, i, how)
    rec, lam = aggregate(strategy, tasks, bad)
    c = tasks[i].client
    assert rec["dropped"].startswith(f"client {c}: ") and reason in rec["dropped"] and rec["dropped"].count("client") == 1
    _, want = aggregate(strategy, tasks[:i] + tasks[i + 1:], done[:i] + done[i + 1:])  # a round without that client
    assert all(torch.allclose(lam[k], want[k], rtol=0, atol=1e-6) for k in want)
    _, honest = aggregate(strategy, tasks, done)
    assert any(not torch.equal(lam[k], honest[k]) for k in honest)  # the check made a difference


def test_good_replies_are_all_aggregated_and_the_bound_is_an_option(round0):
    strategy, tasks, done = round0
    rec, _ = aggregate(strategy, tasks, done)
    assert "dropped" not in rec
    sent, r = tasks[0].lam, done[0].result
    big = [replace(done[0], result=replace(r, lam={k: sent[k] + 100 * (v - sent[k]) for k, v in r.lam.items()}))] + done[1:]
    unbounded = meta_train.MetaStrategy(strategy.ctx, strategy.lam0)
    unbounded.cfg = replace(strategy.cfg, norm_bound=0.0)
    rec, _ = aggregate(unbounded, tasks, big)
    assert "dropped" not in rec  # without --norm-bound only malformed replies are refused


def test_a_round_whose_every_reply_is_dropped_stops_with_one_line(round0):
    strategy, tasks, done = round0
    bad = done
    for i in range(len(done)):
        bad = spoil(bad, i, "nan")
    with pytest.raises(FedL2PError, match="round 1: every reply was dropped"):
        aggregate(strategy, tasks, bad)


def test_reject_reason_accepts_a_well_formed_reply():
    sent = {"a": torch.zeros(2, 3), "b": torch.ones(4)}
    assert reject_reason(sent, {"a": torch.ones(2, 3), "b": torch.zeros(4)}, 5, 10) is None
    assert "float64" in reject_reason(sent, {"a": torch.ones(2, 3, dtype=torch.float64), "b": torch.zeros(4)}, 5, 10)
    assert "unexpected c" in reject_reason(sent, {**sent, "c": torch.ones(1)}, 5, None)
    assert "claims 0" in reject_reason(sent, sent, 0, None)


def test_median_and_trimmed_mean_are_coordinate_wise():
    states = [{"w": torch.tensor([float(v), -float(v)])} for v in (1, 2, 3, 4, 100)]
    assert torch.equal(robust_average(states, [1] * 5, "median")["w"], torch.tensor([3.0, -3.0]))
    assert torch.equal(robust_average(states, [1] * 5, "trimmed-mean")["w"], torch.tensor([3.0, -3.0]))  # 1 cut per end
    assert torch.allclose(robust_average(states, [1] * 5, "mean")["w"], torch.tensor([22.0, -22.0]))
