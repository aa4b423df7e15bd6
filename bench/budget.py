"""`python bench/budget.py [CELL ...] [--rounds 20,60,200]`: FedL2P's accuracy against its meta-train budget.

For each bench-accuracy cell named (default: fs-1000), the stable IFT and FOMAML+ are meta-trained at every round
count asked for (the cell's meta-train settings and its 3 meta-train seeds), each kept with `--keep best` (the round
with the lowest validation loss, the paper) and `--keep last`, and personalised beside the hand-made FT methods and FT
tuned on both pools: the same clients, seeds and batches as the cell. Each round count is one pipeline run, in
increasing order, so every run continues the shorter one from its stored state (`fedl2p meta-train` extends) and a
`--keep last` run reuses its `--keep best` twin's rounds: the curve costs the longest run's rounds, once per
variant and seed. Killed, it resumes where it stopped (every stage is an artifact).

Writes bench/budget.md (the table), bench/budget.json and bench/budget.png (accuracy against rounds, and the sampled
clients' mean validation loss per round of the longest runs).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

from fedl2p_cli.analysis import tables

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import accuracy  # noqa: E402  (the cells' definitions)

VARIANTS = {"IFT (stable)": {}, "FOMAML+": {"meta_grad": "fomaml"}}
CHOICES = {"ift": "IFT (stable)", "fomaml": "FOMAML+"}  # --variants
KEEPS = ("best", "last")  # best first: the last-kept twin then reuses its rounds
HANDMADE = ["ft-bnc", "ft-bng", "ft-bni", "ft-tuned"]


def grid(cell: str, rounds: int, variants: list[str]) -> list[dict]:
    """The cell's default meta-train runs (one per meta-train seed) as each variant and keep, at `rounds`."""
    base = accuracy.sections(cell, stable_ift=True)["meta-train"]
    return [m | {"rounds": rounds, "keep": keep, "workers": 1} | VARIANTS[v]
            for v in variants for m in base for keep in KEEPS]


def run(cell: str, rounds: int, variants: list[str]) -> list[str]:
    """Build (or reuse) one round count's runs and their personalisation; the personalize artifacts' ids."""
    import torch
    torch.set_num_threads(1)
    from fedl2p_cli.cli.render import RichProgress
    from fedl2p_cli.stages import pipeline
    secs = accuracy.sections(cell, full=False)
    secs["meta-train"] = grid(cell, rounds, variants)
    secs["personalize"] = dict(accuracy.sections(cell)["personalize"], methods=HANDMADE)
    t0 = time.time()
    res = pipeline.run(pipeline.Pipeline(f"budget-{cell}-{rounds}-{len(variants)}", secs, pipeline.Store(accuracy.STORE)), None,
                       RichProgress, runtime=accuracy.handed())
    print(f"[{cell}, {rounds} rounds] done in {time.time() - t0:.0f} s", flush=True)
    return [r.artifact.id for r in res if r.stage == "personalize"]


def label(variant: str) -> tuple[str, str]:
    """(variant, keep) of a merged learned row's name, e.g. fedl2p-fomaml-last."""
    keep = "last" if variant.endswith("-last") else "best"
    return ("FOMAML+" if "-fomaml" in variant else "IFT (stable)"), keep


def rows(cell: str, rounds: int, pers_ids: list[str]) -> list[dict]:
    from fedl2p_cli.artifacts import Store
    store = Store(accuracy.STORE)
    out = []
    for pid in pers_ids:
        art = store.load("personalize", pid, verify=False)
        s = json.loads(art.file("summary.json").read_text())
        merged = accuracy.over_meta_seeds(s["methods"])
        runs = {m["variant"]: m for m in accuracy.meta_runs(pid)}
        for name, v in merged.items():
            if name.startswith("ft-"):
                continue
            variant, keep = label(name)
            kept = [r["kept_round"] for n, r in runs.items() if n.split("-seed")[0] == name]
            out.append({"cell": cell, "pool": s["pool"], "rounds": rounds, "variant": variant, "keep": keep,
                        "mean": v["mean"], "sd": v["sd"], "vs_best_ft": v.get("vs_best_baseline"),
                        "vs_best_ft_sd": v.get("vs_best_baseline_sd"), "vs_ft_tuned": v.get("vs_ft_tuned"),
                        "vs_ft_tuned_sd": v.get("vs_ft_tuned_sd"), "kept_rounds": kept,
                        "best_ft": s["best_baseline"], "best_ft_mean": s["methods"][s["best_baseline"]]["mean"],
                        "ft_tuned_mean": s["methods"]["ft-tuned"]["mean"], "personalize": pid})
    return out


def val_curves(cell: str, rounds: int, column: str = "val_loss") -> dict[str, list[float]]:
    """Per variant, a history.csv column per round (the sampled clients' validation loss, or a BN layer's mean beta
    `beta_i`), averaged over the meta-train seeds (the --keep best runs of `rounds` rounds: the loop is the same for
    both keeps)."""
    from fedl2p_cli.artifacts import Store
    store = Store(accuracy.STORE)
    curves: dict[str, list[list[float]]] = {}
    ours = {r["id"] for pid in _done(cell).get(str(rounds), []) for r in accuracy.meta_runs(pid)}
    for art in store.iter("meta-train"):
        if art.id not in ours or art.config.get("rounds") != rounds or art.config.get("keep") != "best":
            continue
        with open(art.file("history.csv")) as f:
            h = list(csv.DictReader(f))
        variant, _ = label(art.metrics["variant"].split("-seed")[0])
        curves.setdefault(variant, []).append([float(x[column]) for x in h])
    return {v: np.mean([c[:min(map(len, cs))] for c in cs], axis=0).tolist() for v, cs in curves.items()}


def longest_curves(cell: str, finished: list[int], column: str = "val_loss") -> dict[str, list[float]]:
    """`val_curves` per variant from the longest of its finished round counts (a variant still running at the
    longest count is shown at the longest it finished)."""
    out: dict[str, list[float]] = {}
    for rounds in sorted(finished, reverse=True):
        for variant, c in val_curves(cell, rounds, column).items():
            out.setdefault(variant, c)
    return out


def bn_layers(cell: str, rounds: int) -> int:
    """How many BN layers the cell's model has: the beta_i columns of its runs' history."""
    from fedl2p_cli.artifacts import Store
    pid = _done(cell)[str(rounds)][0]
    art = Store(accuracy.STORE).load("meta-train", accuracy.meta_runs(pid)[0]["id"], verify=False)
    with open(art.file("history.csv")) as f:
        header = next(csv.reader(f))
    return sum(1 for h in header if h.startswith("beta_") and h[5:].isdigit())


def _done(cell: str) -> dict[str, list[str]]:
    return _load().get(cell, {})


def _load() -> dict:
    f = HERE / "budget-ids.json"
    return json.loads(f.read_text()) if f.is_file() else {}


def _record(cell: str, rounds: int, variants: list[str], ids: list[str]) -> None:
    """Keep each round count's personalisations, one per pool and set of variants (a later run adds, never drops)."""
    d = _load()
    got = d.setdefault(cell, {}).setdefault(str(rounds), [])
    d[cell][str(rounds)] = got + [i for i in ids if i not in got]
    (HERE / "budget-ids.json").write_text(json.dumps(d, indent=2))


def table(all_rows: list[dict]) -> str:
    cols = ["cell", "pool", "rounds", "variant", "keep", "accuracy", "Δ vs best FT", "Δ vs FT tuned", "kept round per seed"]
    return tables.markdown(cols, ([r["cell"], r["pool"], r["rounds"], r["variant"], r["keep"],
                                   f"{100 * r['mean']:.2f} ± {100 * r['sd']:.2f}",
                                   f"{100 * r['vs_best_ft']:+.2f} ± {100 * r['vs_best_ft_sd']:.2f} ({r['best_ft']} "
                                   f"{100 * r['best_ft_mean']:.2f})",
                                   f"{100 * r['vs_ft_tuned']:+.2f} ± {100 * r['vs_ft_tuned_sd']:.2f}",
                                   " / ".join(map(str, r["kept_rounds"]))]
                                  for r in sorted(all_rows, key=lambda r: (r["cell"], r["pool"] != "seen", r["variant"],
                                                                           r["keep"], r["rounds"]))))


def plot(all_rows: list[dict], curves: dict[str, dict[str, list[float]]], betas: dict[str, dict[str, list[float]]],
         out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = sorted({(r["cell"], r["pool"]) for r in all_rows}, key=lambda cp: (cp[0], cp[1] != "seen"))
    from matplotlib.ticker import NullFormatter
    n = len(panels) + 2 * len(curves)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.4), squeeze=False)
    for ax, (cell, pool) in zip(axes[0], panels):
        rs = [r for r in all_rows if (r["cell"], r["pool"]) == (cell, pool)]
        for variant in VARIANTS:
            for keep, style in zip(KEEPS, ("-", "--")):
                pts = sorted((r["rounds"], 100 * r["mean"], 100 * r["sd"]) for r in rs
                             if (r["variant"], r["keep"]) == (variant, keep))
                if pts:
                    x, y, e = zip(*pts)
                    ax.errorbar(x, y, yerr=e, ls=style, marker="o", capsize=3, label=f"{variant}, keep {keep}")
        ax.axhline(100 * rs[0]["best_ft_mean"], color="k", lw=1, label=f"best FT ({rs[0]['best_ft']})")
        ax.axhline(100 * rs[0]["ft_tuned_mean"], color="grey", lw=1, ls=":", label="FT tuned")
        ax.set(xscale="log", xlabel="meta-train rounds", ylabel="accuracy (%)", title=f"{cell}, {pool} pool")
        ax.set_xticks(sorted({r["rounds"] for r in rs}), labels=[str(x) for x in sorted({r["rounds"] for r in rs})])
        ax.xaxis.set_minor_formatter(NullFormatter())
    for ax, (cell, cs) in zip(axes[0][len(panels):], curves.items()):
        for variant, c in cs.items():
            ax.plot(range(1, len(c) + 1), c, label=variant)
        ax.set(xlabel="round", ylabel="sampled clients' validation loss", title=f"{cell}: validation loss per round")
        ax.legend(fontsize=7)
    for ax, (cell, bs) in zip(axes[0][len(panels) + len(curves):], betas.items()):
        for key, c in bs.items():
            ax.plot(range(1, len(c) + 1), c, label=key)
        ax.set(xlabel="round", ylabel="mean β over the sampled clients", ylim=(0, 1), title=f"{cell}: β per BN layer")
        ax.legend(fontsize=7)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cells", nargs="*", default=["fs-1000"], choices=list(accuracy.CELLS), metavar="CELL",
                    help=f"bench-accuracy cells ({', '.join(accuracy.CELLS)}; default fs-1000)")
    ap.add_argument("--rounds", default="20,60,200", help="meta-train round counts, comma-separated (default 20,60,200)")
    ap.add_argument("--variants", default="ift,fomaml", help="which of ift (the stable IFT) and fomaml (FOMAML+) to run, "
                    "comma-separated (default both)")
    ap.add_argument("--report", action="store_true", help="only write the report from the runs already finished")
    args = ap.parse_args()
    try:
        counts = sorted({int(x) for x in args.rounds.split(",")})
    except ValueError:
        raise SystemExit(f"budget: --rounds must be integers separated by commas, got {args.rounds!r}") from None
    variants = [CHOICES.get(v.strip(), v.strip()) for v in args.variants.split(",")]
    if not set(variants) <= set(VARIANTS):
        raise SystemExit(f"budget: --variants takes ift and/or fomaml, got {args.variants!r}")
    if not args.report:
        for cell in args.cells:
            accuracy.prerequisites(cell)
            for r in counts:
                _record(cell, r, variants, run(cell, r, variants))
    all_rows, curves, betas = [], {}, {}
    for cell in args.cells:
        done = _done(cell)
        for r in counts:
            if str(r) in done:
                all_rows += rows(cell, r, done[str(r)])
        finished = [r for r in counts if str(r) in done]
        if finished:
            curves[cell] = longest_curves(cell, finished)
            betas[cell] = {f"{v}, bn{i}": c for i in range(bn_layers(cell, max(finished)))
                           for v, c in longest_curves(cell, finished, f"beta_{i}").items()}
    if not all_rows:
        raise SystemExit("budget: no finished run yet")
    # a round count personalised more than once (other --variants): each row once, from its latest personalisation
    all_rows = list({(r["cell"], r["pool"], r["rounds"], r["variant"], r["keep"]): r for r in all_rows}.values())
    (HERE / "budget.json").write_text(json.dumps({"rows": all_rows, "val_loss": curves, "beta": betas}, indent=2))
    (HERE / "budget.md").write_text(table(all_rows) + "\n")
    plot(all_rows, curves, betas, HERE / "budget.png")
    print(table(all_rows))


if __name__ == "__main__":
    main()
