"""bench/accuracy.py's `--stable-ift`: which of a cell's meta-train runs it keeps (no run: the cells' files only)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fedl2p_cli import plugins
from fedl2p_cli.artifacts import Store
from fedl2p_cli.stages import pipeline

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import accuracy  # noqa: E402


def variants(sections: dict) -> list[str]:
    """The meta-train variants of a cell's pipeline, as its compiled plan names them (nothing runs)."""
    plan = pipeline.compile(pipeline.Pipeline("test", sections, Store("unused")), plugins.current())
    return [s.label for s in plan.steps if s.stage == "meta-train"]


@pytest.mark.parametrize("cell", list(accuracy.CELLS))
def test_stable_ift_keeps_exactly_the_cells_default_variant_at_three_seeds(cell):
    full = variants(accuracy.sections(cell))
    kept = variants(accuracy.sections(cell, stable_ift=True))
    assert kept == ["fedl2p", "fedl2p-seed1", "fedl2p-seed2"]
    assert [v for v in full if v in kept] == kept and len(full) > len(kept)  # the others are left out, none lost


def test_fs_1000_runs_the_papers_alg2_beside_the_default():
    """The feature-shift cells name the paper's Alg. 2 explicitly (it is no longer the default)."""
    full = variants(accuracy.sections("fs-1000"))
    assert full.count("fedl2p-psifixed-unscaled-etab0-etaift") == 1 and len(set(full)) == len(full)



def joined(r, full: dict, learned: list[str]) -> dict:
    """The main summary without the learned rows, then those rows joined from the same results with their deltas
    stripped: what merge_extras computes for an extra group on the same clients, seeds and batches."""
    keys = ("vs_best_baseline", "clients_better", "vs_ft_tuned")
    main = full | {"methods": {m: v for m, v in full["methods"].items() if m not in learned}}
    extra = full | {"methods": {m: {k: x for k, x in v.items() if k not in keys} for m, v in full["methods"].items()}}
    accuracy.join(r, main, r, extra)
    return main


def test_an_extra_groups_rows_join_with_personalizes_own_paired_deltas(tiny_store):
    """merge_extras pairs another personalisation's learned rows against the main one's best baseline and tuned row with
    the package's function: the numbers `fedl2p personalize` wrote in summary.json (tiny store), and with a tuned row
    (the tiny store's ft-bni results relabelled ft-tuned: running ft-tuned's 10 candidates here took minutes) the
    numbers personalize.summarize gives."""
    import json
    from dataclasses import replace

    from fedl2p_cli.stages import partition, personalize
    store, art = tiny_store["store"], tiny_store["personalize"]
    _, r = personalize.load(store, art.id)
    full = json.loads(art.file("summary.json").read_text())
    learned = personalize.learned_rows(art, r)
    assert learned and all("vs_best_baseline" in full["methods"][m] for m in learned)
    assert joined(r, full, learned)["methods"] == full["methods"]

    as_tuned = lambda d: {("ft-tuned" if k == "ft-bni" else k): v for k, v in d.items()}  # noqa: E731
    r2 = replace(r, methods=["ft-tuned" if m == "ft-bni" else m for m in r.methods], beta=as_tuned(r.beta),
                 eta=as_tuned(r.eta), sparsity=as_tuned(r.sparsity))
    _, part = partition.load(store, tiny_store["partition"].id)
    s2 = personalize.summarize(r2, part.domain_names, plugins.current())
    assert all("vs_ft_tuned" in s2["methods"][m] for m in learned)
    assert joined(r2, s2, learned)["methods"] == s2["methods"]


def test_a_cells_rows_are_the_artifacts_its_compiled_plans_name(tmp_path, monkeypatch):
    """collect finds a cell's personalisations (and its extra group's) by executing the cells' pipeline plans with
    reuse_only, on a tiny cell (the tiny pipeline and a FOMAML+ extra group): the ids `fedl2p run` made, nothing built."""
    import shutil

    root = Path(__file__).resolve().parents[1]
    bench = tmp_path / "pipelines"
    bench.mkdir()
    shutil.copy(root / "pipelines" / "tiny.toml", bench / "tiny.toml")
    (bench / "tiny.extras.toml").write_text('extends = "tiny.toml"\nname = "tiny.extras"\n\n[[meta-train]]\npreset = "fomaml"\n'
                                            'rounds = 2\n'
                                            'fraction = 0.5\nepochs = 1\nbatch_size = 16\nbase_lr = 0.01\nmeta_grad = "fomaml"\n'
                                            'beta_init = 0.5\n')
    monkeypatch.setattr(accuracy, "BENCH", bench)
    monkeypatch.setattr(accuracy, "STORE", tmp_path / "store")
    monkeypatch.setitem(accuracy.CELLS, "tiny", ("feature", 1.0))
    assert accuracy.collect("tiny") is None  # nothing run yet: not complete, and nothing was built
    assert not (tmp_path / "store" / "partition").exists() or not any((tmp_path / "store" / "partition").iterdir())
    accuracy.run_cell("tiny")
    store = Store(tmp_path / "store")
    made = {k: [a.id for a in store.iter("personalize") if a.parents.get(f"meta-train:{k}")] for k in ("fedl2p", "fedl2p-fomaml")}
    assert len(made["fedl2p"]) == 2 and len(made["fedl2p-fomaml"]) == 2  # each file personalised both pools
    rows = accuracy.collect("tiny")
    assert sorted(r["pool"] for r in rows) == ["seen", "unseen"]
    assert sorted(r["personalize"] for r in rows) == sorted(made["fedl2p"])
    for r in rows:  # the extra group's learned row joined, paired against this personalisation's best baseline
        assert {"fedl2p", "fedl2p-fomaml"} <= set(r["methods"]) and "vs_best_baseline" in r["methods"]["fedl2p-fomaml"]
    assert all("fedl2p-fomaml" not in r["methods"] for r in accuracy.collect("tiny", stable_ift=True))
