"""Markdown tables come from one helper (fedl2p_cli/analysis/tables.py): the CLI's log tables and bench/accuracy.py's
report, rendered here from synthetic rows (the real report needs a store of finished cells that took hours)."""

from __future__ import annotations

import sys
from pathlib import Path

from fedl2p_cli.analysis import tables

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import accuracy  # noqa: E402

HAND = ("ft-bnc", "ft-bng", "ft-bni", "ft-tuned")
LEARNED = {"mean": 0.7345, "sd": 0.0121, "vs_best_baseline": 0.0123, "vs_ft_tuned": -0.0045, "clients_better": 0.6,
           "beta_per_domain": {"clean": [0.91, 0.52, 0.33], "fog": [0.85, 0.41, 0.2]}}
RUNS = [{"variant": "fedl2p", "eta_last": 1.2, "eta_min": 0.8, "eta_max": 1.9, "kept_round": 12, "diverged": False,
         "rounds_run": 20, "val_first": 1.234, "val_last": 0.987},
        {"variant": "fedl2p-seed1", "eta_last": 9.0, "eta_min": 1.0, "eta_max": 9.0, "kept_round": 3, "diverged": 14,
         "rounds_run": 14, "val_first": 1.2, "val_last": float("nan")}]


def cells() -> list[list[dict]]:
    """A feature-shift cell (both pools, every extra measurement), a speaker cell and a label-shift cell."""
    hand = {m: {"mean": 0.70 + 0.01 * i, "sd": 0.002 * i} for i, m in enumerate(HAND)}
    seen = {"cell": "fs-1000", "kind": "feature", "alpha": 1000.0, "pool": "seen", "clients": 12, "global": 0.5123,
            "methods": hand | {"fedl2p": LEARNED}, "oracle": (0.81, 0.003), "base_lr": 0.01,
            "sweep": {"clean": {"0.01": [0.7, 0.71, 0.72, 0.73, 0.74], "0.001": [0.6, 0.65, 0.61, 0.6, 0.59]}},
            "client_bn": {"running": {"ft-bnc": 0.7, "fedl2p": 0.73}, "precise": {"ft-bnc": 0.71, "fedl2p": 0.74}},
            "ari": {"xi": 0.512, "beta (fedl2p)": "constant"}, "runs": RUNS}
    unseen = seen | {"pool": "unseen", "methods": hand | {"fedl2p": LEARNED | {"mean": float("nan")}}}
    speech = {"cell": "speech", "kind": "speech", "alpha": float("nan"), "pool": "seen", "global": 0.3, "base_lr": 0.05,
              "methods": hand | {"fedl2p": LEARNED | {"beta_per_domain": {"speakers": [0.5, 0.6]}}}}
    label = {"cell": "ls-0.1", "kind": "label", "alpha": 0.1, "pool": "seen", "global": 0.4, "methods": hand,
             "pretrain_seen_acc": 0.456, "central_acc": 0.789}
    return [[seen, unseen], [speech], [label]]


def full_report(monkeypatch, tmp_path) -> str:
    monkeypatch.setattr(accuracy, "STORE", tmp_path)  # no meta-train runs: each learned name is its own seed group
    done = cells()
    text = accuracy.report(done).split("\n", 1)[1]  # without its stamp (time, commit)
    return text + accuracy.central_report(done) + "\n" + accuracy.beta_report(done) + "\n" + accuracy.runs_report(done[:1])


def table_blocks(text: str) -> list[list[str]]:
    blocks, cur = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cur.append(line)
        elif cur:
            blocks.append(cur)
            cur = []
    return blocks


def test_helper_lines():
    assert tables.lines(["a", "b"], [[1, ""], ["x", 2.5]]) == ["| a | b |", "|---|---|", "| 1 |  |", "| x | 2.5 |"]
    assert tables.titled("T", ["k", "v"], [["a|b", 1 / 3], ["two\nlines", 7]]) == \
        "T\n\n| k | v |\n|---|---|\n| a\\|b | 0.3333 |\n| two lines | 7 |\n"


def test_every_table_of_the_accuracy_report_has_as_many_cells_per_row_as_columns(monkeypatch, tmp_path):
    blocks = table_blocks(full_report(monkeypatch, tmp_path))
    assert len(blocks) == 6  # main, central, beta per domain, sweep, client statistics, runs
    for b in blocks:
        n = b[0].count(" | ") + 1
        assert b[1] == tables.rule(n)
        assert all(line.count(" | ") + 1 == n for line in b[2:]), b


def test_the_accuracy_report_reads_as_before(monkeypatch, tmp_path):
    """Lines of the report as the hand-built tables wrote them (before the helper), for the same rows."""
    text = full_report(monkeypatch, tmp_path)
    for line in [
        "| scenario | α | pool | global | FT (BN C) | FT (BN G) | FT (BN I) | FT tuned (val) | oracle (test, bound) | fedl2p |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| feature shift | 1000 | seen | 51.23 | 70.00 ± 0.00 | 71.00 ± 0.20 | 72.00 ± 0.40 | 73.00 ± 0.60 | 81.00 ± 0.30 | "
        "73.45 ± 0.00 [1.21] (+1.23; -0.45) |",
        "| feature shift | 1000 | unseen | 51.23 | 70.00 ± 0.00 | 71.00 ± 0.20 | 72.00 ± 0.40 | 73.00 ± 0.60 | 81.00 ± 0.30 | N/A |",
        "| speakers (synthetic) (base LR 0.05) | – | seen | 30.00 | 70.00 ± 0.00 | 71.00 ± 0.20 | 72.00 ± 0.40 | 73.00 ± 0.60 "
        "| – | 73.45 ± 0.00 [1.21] (+1.23; -0.45) |",
        "| label shift | 0.1 | seen | 40.00 | 70.00 ± 0.00 | 71.00 ± 0.20 | 72.00 ± 0.40 | 73.00 ± 0.60 | – | – |",
        "| α | FedAvg | central |\n|---|---|---|\n| 0.1 | 45.60 | 78.90 |",
        "| domain | bn0 | bn1 | bn2 |\n|---|---|---|---|\n| clean | 0.910 | 0.520 | 0.330 |\n| fog | 0.850 | 0.410 | 0.200 |\n"
        "| spread (max − min) | 0.060 | 0.110 | 0.130 |",
        "| domain | LR | β=0 | β=0.25 | β=0.5 | β=0.75 | β=1 | best β |\n|---|---|---|---|---|---|---|---|\n"
        "| clean | 0.01 | 70.00 | 71.00 | 72.00 | 73.00 | 74.00 | 1 |\n| clean | 0.001 | 60.00 | 65.00 | 61.00 | 60.00 | 59.00 | 0.25 |",
        "| client statistics | ft-bnc | fedl2p |\n|---|---|---|\n| running | 70.00 | 73.00 |\n| precise | 71.00 | 74.00 |",
        "| fs-1000 | fedl2p | 1.20 (0.80–1.90) | 12 | stable, 20 rounds | 1.234 → 0.987 |\n"
        "| fs-1000 | fedl2p-seed1 | 9.00 (1.00–9.00) | 3 | diverged: 14 | 1.200 → nan |",
    ]:
        assert line in text
