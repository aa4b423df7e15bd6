"""bench/accuracy.py's `--default-ift`: which of a cell's meta-train runs it keeps (no run: the cells' files only)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fedl2p_cli.runtime import Runtime
from fedl2p_cli.stages import pipeline

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import accuracy  # noqa: E402


def variants(tables: list[dict]) -> list[str]:
    return [pipeline._meta_cfg(pipeline._runtime(Runtime(), dict(t), "meta-train", "test")[0], "test").variant()
            for t in tables]


@pytest.mark.parametrize("cell", list(accuracy.CELLS))
def test_default_ift_keeps_exactly_the_cells_default_variant_at_three_seeds(cell):
    full = variants(accuracy.sections(cell)["meta-train"])
    kept = variants(accuracy.sections(cell, default_ift=True)["meta-train"])
    assert kept == ["fedl2p", "fedl2p-seed1", "fedl2p-seed2"]
    assert [v for v in full if v in kept] == kept and len(full) > len(kept)  # the others are left out, none lost


def test_fs_1000_runs_the_papers_alg2_beside_the_default():
    """The feature-shift cells name the paper's Alg. 2 explicitly (it is no longer the default)."""
    full = variants(accuracy.sections("fs-1000")["meta-train"])
    assert full.count("fedl2p-psifixed-unscaled-etab0-etaift") == 1 and len(set(full)) == len(full)
