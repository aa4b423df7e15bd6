"""bench/decompose.py and bench/beta_grid.py run `fedl2p analyze ...` through the CLI (run_cli) on the bench store:
the bench names what is its own (an artifact id, a cell), every option is the command's."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import accuracy  # noqa: E402
import beta_grid  # noqa: E402
import decompose  # noqa: E402
import variants  # noqa: E402


def analyses(store) -> list:
    return list(store.iter("analyze"))


def test_decompose_runs_the_cli_on_the_given_personalisation(tiny_store, monkeypatch):
    store = tiny_store["store"]
    monkeypatch.setattr(accuracy, "STORE", store.root)
    before = {a.id for a in analyses(store)}
    assert decompose.main([tiny_store["personalize"].id, "--eta-scales", "2"]) == 0
    new = [a for a in analyses(store) if a.id not in before]
    assert len(new) == 1 and new[0].parents["personalize"] == tiny_store["personalize"].id
    assert new[0].config["eta_scales"] == [2.0]


def test_beta_grid_runs_the_cli_on_the_cells_statistics_with_the_bench_epochs(tiny_store, monkeypatch):
    store = tiny_store["store"]
    monkeypatch.setattr(accuracy, "STORE", store.root)
    monkeypatch.setattr(accuracy, "prerequisites", lambda cell: {"stats": tiny_store["stats"].id})
    before = {a.id for a in analyses(store)}
    assert beta_grid.main(["fs-1000", "--levels", "0,1", "--seeds", "0"]) == 0
    new = [a for a in analyses(store) if a.id not in before]
    assert len(new) == 1 and new[0].parents["stats"] == tiny_store["stats"].id
    assert new[0].config["levels"] == [0.0, 1.0] and new[0].config["epochs"] == accuracy.EPOCHS


def test_what_is_not_the_bench_own_first_argument_is_one_line_and_exit_2(capsys):
    assert decompose.main(["--beta", "1"]) == 2
    assert beta_grid.main(["no-such-cell"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "personalize artifact id" in err[0] and "cell" in err[1]


def test_the_step_variants_run_on_the_cpu_and_measure_their_distance_from_float32():
    """bench/variants.py (prepared for a GPU): on the CPU, float32 twice is the same update, bf16 autocast a
    different one (not far), and the CUDA-only variants are left out."""
    out = variants.main(["--device", "cpu", "--models", "small-cnn", "--n", "2", "--reps", "1"])
    got = out["models"]["small-cnn"]
    assert set(got) == {"eager", "fp32-strict", "bf16"}
    assert got["eager"]["update_vs_eager"] == 0.0 and got["fp32-strict"]["update_vs_eager"] == 0.0
    assert 0.0 < got["bf16"]["update_vs_eager"] < 0.1
    assert all(v["per_client_s"] > 0 for v in got.values())
