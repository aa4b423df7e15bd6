"""What did meta-training learn, round by round? `python bench/dynamics.py CELL [--rounds 1,5,10,20] [--markdown]`.

For every meta-train artifact of a bench cell (its statistics: pipelines/bench/CELL.toml), from its history.csv: per
kind of client, the mean LR multiplier (eta / base LR) and the mean beta per BN layer that the broadcast lambda gave
the seen clients, and the split between kinds (the largest beta split in a layer, the largest LR ratio of a tensor).
Round 1's row is the initial lambda (the round-0 control: what any split was before training); the last row is the
kept lambda (meta-train's metrics). Reads the store only: run the cell's meta-train first (bench/search.py).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy  # noqa: E402  (the cells' store and pipeline files)


def rows(art) -> list[dict]:
    with art.file("history.csv").open() as f:
        return [r for r in csv.DictReader(f) if not r.get("diverged")]


def kinds(row: dict) -> list[str]:
    return sorted(k[len("lrx_"):] for k in row if k.startswith("lrx_") and row[k] != "")


def line(label: str, row: dict) -> str:
    def beta(k: str) -> str:
        vals = [row[c] for c in sorted(c for c in row if c.startswith(f"beta_{k}_"))]
        return "/".join(f"{float(v):.2f}" for v in vals if v != "")
    per = " · ".join(f"{k} ×{float(row[f'lrx_{k}']):.2f} β {beta(k)}" for k in kinds(row))
    return (f"| {label} | {per} | {float(row.get('split_beta') or 0):.3f} | ×{float(row.get('split_lr') or 1):.2f} | "
            f"{int(float(row.get('frozen') or 0))} |")


def table(art, at: list[int]) -> str:
    hist = rows(art)
    out = [f"#### {art.metrics['variant']} ({art.id}, seed {art.config.get('seed')})", "",
           "| round | per kind: LR multiplier, β per BN layer | β split | LR ratio | frozen |", "|---|---|---|---|---|"]
    for r in at:
        if r <= len(hist):
            out.append(line("0 (init)" if r == 1 else str(r - 1), hist[r - 1]))
    split = art.metrics.get("split") or {}
    if "kept" in split:
        out.append(line(f"kept ({art.metrics.get('kept', '')})", {k: str(v) for k, v in split["kept"].items()}))
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cell")
    ap.add_argument("--rounds", default="1,6,11,21", help="history rows to show (row 1: the initial lambda)")
    ap.add_argument("--variant", default="", help="only variants whose name contains this")
    args = ap.parse_args()
    from fedl2p_cli.stages import pipeline
    ids = accuracy.prerequisites(args.cell)
    store = pipeline.Store(accuracy.STORE)
    at = [int(r) for r in args.rounds.split(",")]
    for art in sorted(store.iter("meta-train"), key=lambda a: (a.metrics.get("variant", ""), a.config.get("seed", 0))):
        if art.parents.get("stats") == ids["stats"] and args.variant in art.metrics.get("variant", ""):
            print(table(art, at))


if __name__ == "__main__":
    main()
