"""`fedl2p meta-train --rounds R` on a store holding the same run with fewer rounds continues it: the result equals a
run of R rounds from the start, under the same id."""

from __future__ import annotations

import shutil

import torch

from fedl2p_cli.artifacts import Store
from fedl2p_cli.io import weights
from fedl2p_cli.stages import meta_train
from tests.conftest import TINY_META

from .helpers import execute


def _copy(tiny_store, dst) -> Store:
    """The tiny store's partition, pretrain and stats artifacts (no meta-train) in a store of our own."""
    for stage in ("partition", "pretrain", "stats"):
        shutil.copytree(tiny_store["store"].root / stage, dst / stage)
    return Store(dst)


def test_more_rounds_continue_a_shorter_run_and_equal_a_run_from_the_start(tiny_store, tmp_path):
    cfg = lambda r: meta_train.MetaTrainConfig.preset("fomaml", rounds=r, fraction=0.5, seed=5, keep="last", meta=TINY_META)  # noqa: E731
    pre, st = tiny_store["pretrain"].id, tiny_store["stats"].id
    scratch = _copy(tiny_store, tmp_path / "a")
    whole, _ = execute(meta_train, cfg(3), scratch, {"pretrain": pre, "stats": st})
    assert "extended_from" not in whole.metrics

    steps = _copy(tiny_store, tmp_path / "b")
    short, _ = execute(meta_train, cfg(2), steps, {"pretrain": pre, "stats": st})
    longer, reused = execute(meta_train, cfg(3), steps, {"pretrain": pre, "stats": st})
    assert not reused and longer.id == whole.id and longer.metrics["extended_from"] == short.id
    assert longer.metrics["rounds_run"] == 3
    a, b = (weights.load(x.file("lambda.safetensors")) for x in (whole, longer))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the shorter run is never a source for a run of other settings
    other, _ = execute(meta_train, meta_train.MetaTrainConfig.preset("fomaml", rounds=3, fraction=0.5, seed=6, keep="last",
                                                         meta=TINY_META), steps, {"pretrain": pre, "stats": st})
    assert "extended_from" not in other.metrics


def test_keep_last_of_as_many_rounds_reuses_a_keep_best_run_and_equals_a_run_from_the_start(tiny_store, tmp_path):
    """--keep only picks which lambda is stored at the end: the --keep last run of a finished --keep best run's rounds
    is its last state, with no round run again, and equals a --keep last run from the start."""
    cfg = lambda keep: meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5, seed=5, keep=keep, meta=TINY_META)  # noqa: E731
    pre, st = tiny_store["pretrain"].id, tiny_store["stats"].id
    whole, _ = execute(meta_train, cfg("last"), _copy(tiny_store, tmp_path / "a"), {"pretrain": pre, "stats": st})

    store = _copy(tiny_store, tmp_path / "b")
    best, _ = execute(meta_train, cfg("best"), store, {"pretrain": pre, "stats": st})
    last, reused = execute(meta_train, cfg("last"), store, {"pretrain": pre, "stats": st})
    assert not reused and last.id == whole.id and last.metrics["extended_from"] == best.id
    assert last.metrics["kept_round"] == 2 and last.metrics["rounds_run"] == 2
    a, b = (weights.load(x.file("lambda.safetensors")) for x in (whole, last))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    a_hist, b_hist = (x.file("history.csv").read_text().splitlines() for x in (whole, last))
    assert [r.split(",")[:3] for r in a_hist] == [r.split(",")[:3] for r in b_hist]
