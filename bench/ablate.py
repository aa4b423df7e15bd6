"""Meta-train variants on one bench-accuracy cell, side by side: `python bench/ablate.py CELL VARIANT ...`.

Each VARIANT is `key=value[,key=value...]` over meta-train settings (those of a `[[meta-train]]` table, e.g.
`meta_grad=fomaml,nets=bnnet,keep=last`); it is added to the cell's common meta-train settings (20 rounds, K = 3,
e = 5, base LR 0.01). Every variant is meta-trained in its own process and personalised on the seen pool (`--pool
unseen`: the unseen one; `--eval-stats`: the learned methods' test-time statistics) with the
FT baselines (3 seeds, the same clients and batches as the cell), reusing the cell's partition, pretrained model and
statistics. Prints one row per variant: accuracy, paired difference to the best FT, and the learned beta per domain.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
from pathlib import Path

import numpy as np

from fedl2p_cli.analysis import tables

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy  # noqa: E402  (the cells' definitions)


def parse(text: str) -> dict:
    out = {}
    for kv in text.split(","):
        k, _, v = kv.partition("=")
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v.strip()
    return out


def run_variant(cell: str, variant: dict, pool: str = "seen", eval_stats: str = "running") -> dict:
    import torch
    torch.set_num_threads(1)
    from fedl2p_cli.cli.render import RichProgress
    from fedl2p_cli.stages import personalize as pers_stage
    from fedl2p_cli.stages import pipeline
    secs = accuracy.sections(cell)
    secs["meta-train"] = [accuracy.sections(cell)["meta-train"][0] | variant]  # the paper-default variant's settings
    secs["personalize"] = dict(secs["personalize"], pools=[pool], methods=["ft-bnc", "ft-bng", "ft-bni"])
    if eval_stats != "running":
        secs["personalize"]["eval_stats"] = eval_stats
    store = pipeline.Store(accuracy.STORE)
    try:
        res = pipeline.run(pipeline.Pipeline(f"ablate-{cell}", secs, store), None, RichProgress, runtime=accuracy.handed())
    except Exception as e:  # one failed variant must not hide the others
        return {"variant": variant, "error": f"{e.__class__.__name__}: {e}"}
    art = [r.artifact for r in res if r.stage == "personalize"][-1]
    _, r = pers_stage.load(store, art.id)
    s = json.loads(art.file("summary.json").read_text())
    meta = pers_stage.learned_rows(art, r)[0]
    i, b = r.methods.index(meta), r.methods.index(s["best_baseline"])
    diff = np.nanmean(r.acc_after[i] - r.acc_after[b], axis=1)  # per seed, paired on clients
    beta = r.beta[meta]  # [clients, layers]
    per_dom = {str(d): [round(float(x), 3) for x in beta[r.domain == d].mean(0)] for d in np.unique(r.domain)}
    return {"variant": variant, "method": meta, "mean": s["methods"][meta]["mean"], "sd": s["methods"][meta]["sd"],
            "best_ft": s["best_baseline"], "best_ft_mean": s["methods"][s["best_baseline"]]["mean"],
            "vs_best_ft": float(diff.mean()), "vs_best_ft_sd": float(diff.std()), "beta_per_domain": per_dom,
            "personalize": art.id, "run": accuracy.meta_runs(art.id)[0]}


def table(rows: list[dict]) -> str:
    """One row per variant: accuracy, the best FT and the paired difference to it, how its meta-train run went."""
    cols = ["variant", "method", "accuracy (3 seeds)", "best FT", "Δ vs best FT (paired)", "η̃ last (min–max), × start",
            "kept round", "end"]
    return tables.markdown(cols, (ablate_row(r) for r in rows))


def ablate_row(r: dict) -> list:
    v = ",".join(f"{k}={x}" for k, x in r["variant"].items())
    if "error" in r:
        return [v, f"FAILED: {r['error']}", "", "", "", "", "", ""]
    m = r["run"]
    return [v, r["method"], f"{100 * r['mean']:.2f} ± {100 * r['sd']:.2f}", f"{r['best_ft']} {100 * r['best_ft_mean']:.2f}",
            f"{100 * r['vs_best_ft']:+.2f} ± {100 * r['vs_best_ft_sd']:.2f}",
            f"{m['eta_last']:.2f} ({m['eta_min']:.2f}–{m['eta_max']:.2f})", m["kept_round"],
            f"diverged: {m['diverged']}" if m["diverged"] else "stable"]

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cell", choices=list(accuracy.CELLS))
    ap.add_argument("variants", nargs="+", help="key=value[,key=value...] meta-train settings per variant")
    ap.add_argument("--pool", choices=("seen", "unseen"), default="seen",
                    help="clients to personalise (unseen: the meta-nets learned on the seen pool, as in Table 4)")
    ap.add_argument("--eval-stats", choices=("running", "test-batch"), default="running",
                    help="test-time statistics of the learned methods (see `fedl2p personalize --help`)")
    ap.add_argument("--jobs", type=int, default=2, help="processes (one torch thread each)")
    ap.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    args = ap.parse_args()
    variants = [parse(v) for v in args.variants]
    accuracy.prerequisites(args.cell)  # once, before the variants' processes would race for the build locks
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        rows = pool.starmap(run_variant, [(args.cell, v, args.pool, args.eval_stats) for v in variants], chunksize=1)
    print("\n" + table(rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
