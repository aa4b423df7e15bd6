"""bench/accuracy.py's `--default-ift`: which of a cell's meta-train runs it keeps (no run: the cells' files only)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fedl2p_cli.artifacts import Store
from fedl2p_cli.stages import pipeline

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import accuracy  # noqa: E402


def variants(sections: dict) -> list[str]:
    """The meta-train variants of a cell's pipeline, as its compiled plan names them (nothing runs)."""
    plan = pipeline.compile(pipeline.Pipeline("test", sections, Store("unused")))
    return [s.label for s in plan.steps if s.stage == "meta-train"]


@pytest.mark.parametrize("cell", list(accuracy.CELLS))
def test_default_ift_keeps_exactly_the_cells_default_variant_at_three_seeds(cell):
    full = variants(accuracy.sections(cell))
    kept = variants(accuracy.sections(cell, default_ift=True))
    assert kept == ["fedl2p", "fedl2p-seed1", "fedl2p-seed2"]
    assert [v for v in full if v in kept] == kept and len(full) > len(kept)  # the others are left out, none lost


def test_fs_1000_runs_the_papers_alg2_beside_the_default():
    """The feature-shift cells name the paper's Alg. 2 explicitly (it is no longer the default)."""
    full = variants(accuracy.sections("fs-1000"))
    assert full.count("fedl2p-psifixed-unscaled-etab0-etaift") == 1 and len(set(full)) == len(full)
