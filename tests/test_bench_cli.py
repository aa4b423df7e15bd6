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


def test_the_gpu_report_reads_a_run_as_the_gpu_bench_writes_it(monkeypatch):
    """bench/gpu_report.py (issue 71's must-show tables) on a run shaped by bench/gpu.py's own writer (its batched
    part, run on the CPU with one epoch and one iteration) and the GPU-only parts given: each goal is judged against
    its threshold, a part the run did not reach is left out."""
    import json

    import gpu
    import gpu_report
    import torch
    monkeypatch.setitem(gpu.CIFAR, "epochs", 1)
    monkeypatch.setitem(gpu.CIFAR, "iterations", 1)
    small = gpu.batched_model({}, "small-cnn", torch.device("cpu"), (1, 2), (1, 2))
    # the ResNet-18 part and what only a GPU records, made up: the IFT 1.2x FOMAML+ at N = 32, 2.0x at N = 8
    r18 = {"step": {1: {"per_client_s": 0.03, "peak_gpu_mb": 2800.0, "auto_n": 22}, 32: {"per_client_s": 0.004}},
           "fomaml_round": {1: {"per_client_s": 3.3}, 8: {"per_client_s": 0.5}, 32: {"per_client_s": 0.25}},
           "ift_round": {1: {"per_client_s": 3.7, "auto_n": 40}, 8: {"per_client_s": 1.0}, 32: {"per_client_s": 0.3}}}
    run = json.loads(json.dumps({"device": "NVIDIA H100", "torch": "2.11", "cuda": "13.0",
                                 "batched": {"resnet18-cifar": r18, "small-cnn": small},
                                 "projection_batched_h": {"meta_train_500_rounds_x_100_clients_ift": 500 * 100 * 0.3 / 3600},
                                 "quickstart_s": {"default": 41.0, "one_at_a_time": "Traceback: boom"},
                                 "quickstart_meta_train_ids": {"default": ["8ce6b3c73718"], "one_at_a_time": []}}))
    text = gpu_report.report(run, None, ["8ce6b3c73718"])
    lines = text.splitlines()
    assert lines[0] == "# One GPU run: NVIDIA H100, torch 2.11, CUDA 13.0"
    rows = [ln for ln in lines if ln.startswith("| small-cnn |")]
    assert [ln.split(" | ")[1] for ln in rows] == ["1", "2"]  # the writer's N, both rounds measured at each
    assert all(ln.split(" | ")[5] != "–" for ln in rows)  # the IFT's ratio to FOMAML+ from the writer's own keys
    assert "- resnet18-cifar: step N = 22, ift_round N = 40" in lines

    def verdict(goal: str) -> str:
        return next(ln for ln in lines if ln.startswith(f"| {goal}")).rsplit(" | ", 1)[1]
    assert verdict("IFT round per client ≤ 1.5×") == "**no** |"  # 2.0x at N = 8
    assert verdict("ResNet-18 IFT round per client ≥ 8×") == "yes |"  # 4.2 s / 0.3 s = 14x
    assert verdict("CIFAR-10 meta-training (IFT") == "**no** |"  # 500 x 100 x 0.3 s = 4.2 h
    quick = next(ln for ln in lines if ln.startswith("| `fedl2p run quickstart` as shipped"))
    assert "default: 41.0 s; one at a time: failed (Traceback: boom)" in quick and quick.endswith("| yes |")
    assert verdict("quickstart (default): the CPU's") == "yes |" and verdict("quickstart (one_at_a_time): the CPU's") == "**no** |"
    assert "Host syncs" not in text and "variants" not in text  # parts the run did not reach


def test_the_gpu_bench_quickstart_baseline_runs_every_stage_one_client_at_a_time(tmp_path):
    """bench/gpu.py's quickstart baseline: the shipped file with every stage's clients one at a time (engine local in
    the stages with rounds, client_batch 1 in personalize) is still a pipeline `fedl2p run` accepts."""
    import subprocess

    import gpu
    cli = [sys.executable, "-m", "fedl2p_cli", "run"]
    shown = subprocess.run([*cli, "quickstart", "--show"], capture_output=True, text=True, check=True).stdout
    (tmp_path / "q.toml").write_text(gpu.one_at_a_time(shown))
    r = subprocess.run([*cli, str(tmp_path / "q.toml"), "--show"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("[", "engine", "client_batch"))]
    at = {head: lines[lines.index(head) + 1] for head in ("[pretrain]", "[[meta-train]]", "[personalize]")}
    assert at == {"[pretrain]": 'engine = "local"', "[[meta-train]]": 'engine = "local"', "[personalize]": "client_batch = 1"}


def test_the_gpu_bench_merges_only_a_run_of_the_same_card(monkeypatch, tmp_path):
    """bench/gpu.py --merge (gpu-session.sh: each part under its own cap) adds to what an earlier call wrote on the same
    card, torch and CUDA; a file another card or version wrote is not mixed in."""
    import json

    import gpu
    monkeypatch.setattr(gpu, "HERE", tmp_path)
    card = {"device": "NVIDIA H100", "torch": "2.11", "cuda": "13.0"}
    assert gpu._earlier(dict(card)) == card  # nothing written yet
    (tmp_path / "gpu.json").write_text(json.dumps(card | {"batched": {"small-cnn": {}}}))
    assert gpu._earlier(dict(card)) == card | {"batched": {"small-cnn": {}}}
    assert gpu._earlier(card | {"torch": "2.14"}) == card | {"torch": "2.14"}
