"""Search for a FedL2P default that personalises: `python bench/search.py CELL[,CELL...] VARIANT ... [--seeds 0,1,2]`.

A CELL is any shipped bench pipeline (pipelines/bench/CELL.toml: the eight cells and the planted family). A VARIANT
is `name:key=value[,key=value...]` over meta-train settings, added to the cell's common ones (20 rounds, K = 3, e = 5,
its base LR); `name:` alone is the cell's own meta-train settings (today's defaults). Per cell the script builds (or
reuses) its partition, model and statistics, personalises the hand-made methods and `ft-tuned` once on both pools,
then meta-trains every variant at every seed and personalises it on both pools with the cell's personalisation seeds.
Every run is an artifact, so a killed search resumes where it stopped. Rows: accuracy, paired Δ against `ft-tuned`
and against the best fixed FT (same clients, seeds and batches; checked), β per kind, the largest split between kinds
in a layer and the ARI of β against the kinds. `--json FILE` keeps the rows; `python bench/search.py report FILE ...`
prints them as tables (mean ± SD over meta-train seeds).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy  # noqa: E402  (the cells' pipeline files and store)

HAND = ["ft-bnc", "ft-bng", "ft-bni"]


def parse(text: str) -> tuple[str, dict]:
    name, _, rest = text.partition(":")
    out: dict = {}
    for kv in filter(None, rest.split(",")):
        k, _, v = kv.partition("=")
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v.strip()
    return name, out


def _run(label: str, secs: dict) -> dict:
    from fedl2p_cli.cli.render import RichProgress
    from fedl2p_cli.stages import pipeline
    res = pipeline.run(pipeline.Pipeline(label, secs, pipeline.Store(accuracy.STORE)), None, RichProgress,
                       runtime=accuracy.handed())
    return {f"{r.stage}:{r.label}": r.artifact.id for r in res}


def baselines(cell: str) -> dict:
    secs = accuracy.sections(cell)
    secs["meta-train"] = []
    secs["personalize"] = dict(secs["personalize"], pools=["seen", "unseen"], methods=HAND + ["ft-tuned"])
    return _run(f"search-{cell}-baselines", secs)


def variant(cell: str, settings: dict, seed: int) -> dict:
    secs = accuracy.sections(cell)
    # the budget the cell's runs share; the method's options are the defaults' unless a variant names them
    budget = ("rounds", "fraction", "iterations", "epochs", "batch_size", "base_lr")
    common = {k: v for k, v in secs["meta-train"][0].items() if k in budget}
    secs["meta-train"] = [common | settings | {"seed": seed, "workers": 1}]  # two searches share the 2 cores
    secs["personalize"] = dict(secs["personalize"], pools=["seen", "unseen"], methods=HAND + ["fedl2p-checked"])
    return _run(f"search-{cell}", secs)


def results(pid: str):
    from fedl2p_cli.stages import personalize as pers_stage
    from fedl2p_cli.stages import pipeline
    return pers_stage.load(pipeline.Store(accuracy.STORE), pid)


def learned(art, r) -> str:
    from fedl2p_cli.stages import personalize as pers_stage
    return pers_stage.learned_rows(art, r)[0]


def ari(labels: np.ndarray, beta: np.ndarray) -> float:
    """ARI of a k-means clustering of β (k = the number of kinds) against the kinds."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score
    k = len(np.unique(labels))
    if np.ptp(beta, axis=0).max() < 1e-6:
        return 0.0
    pred = KMeans(k, n_init=10, random_state=0).fit_predict(beta)
    return float(adjusted_rand_score(labels, pred))


def score(base_pid: str, var_pid: str) -> dict:
    """One variant run on one pool against the pool's baselines: paired on clients, seeds and batches."""
    _, b = results(base_pid)
    art, r = results(var_pid)
    assert np.array_equal(b.client, r.client) and b.seeds == r.seeds, "the two runs personalised other clients"
    for m in HAND:  # the same batches: the hand-made rows of both runs must agree
        d = np.nanmax(np.abs(b.acc_after[b.methods.index(m)] - r.acc_after[r.methods.index(m)]))
        assert d < 1e-9, f"{m} differs between the runs by {d}: not the same batches"
    m = learned(art, r)
    acc = r.acc_after[r.methods.index(m)]
    checked = r.acc_after[r.methods.index(f"{m}-checked")] if f"{m}-checked" in r.methods else None
    hand = {h: b.acc_after[b.methods.index(h)] for h in HAND}
    best = max(hand, key=lambda h: np.nanmean(hand[h]))
    tuned = b.acc_after[b.methods.index("ft-tuned")]
    beta = r.beta[m]
    kinds = {int(d): beta[r.domain == d].mean(0) for d in np.unique(r.domain)}
    split = max(float(np.max(np.abs(kinds[a] - kinds[c]))) for a in kinds for c in kinds) if len(kinds) > 1 else 0.0
    return {"method": m, "acc": float(np.nanmean(acc)), "vs_tuned": float(np.nanmean(acc - tuned)),
            "vs_best_ft": float(np.nanmean(acc - hand[best])), "best_ft": best, "best_ft_acc": float(np.nanmean(hand[best])),
            "tuned_acc": float(np.nanmean(tuned)), "tuned_sd": float(np.std(np.nanmean(tuned, axis=1))),
            "beta_per_kind": {k: [round(float(x), 3) for x in v] for k, v in kinds.items()}, "split": split,
            "ari": ari(r.domain, beta), "personalize": var_pid, "per_kind": kind_rows(art, r, b, m)} | (
            {} if checked is None else {
            "checked_acc": float(np.nanmean(checked)), "checked_vs_tuned": float(np.nanmean(checked - tuned)),
            "checked_vs_best_ft": float(np.nanmean(checked - hand[best]))})


def kind_rows(art, r, b, m: str) -> dict:
    """Per kind: the learned row's accuracy, its paired Δ against ft-tuned and the kind's best fixed FT (that FT named),
    from analysis/per_kind.py over the variant's row and the baselines' (the same clients, seeds and batches)."""
    from fedl2p_cli.analysis import per_kind
    names = json.loads(art.file("summary.json").read_text()).get("per_kind", {}).get("kinds")
    if not names:
        return {}
    rows = HAND + ["ft-tuned", m]
    acc = np.stack([b.acc_after[b.methods.index(h)] for h in rows[:-1]] + [r.acc_after[r.methods.index(m)]])
    pk = per_kind.table(rows, acc, r.domain, dict(zip(map(int, np.unique(r.domain)), names)),
                        per_kind.Roles(tuple(HAND), "ft-tuned", (m,)))
    return {k: {"acc": v["mean"], "vs_tuned": v["vs_ft_tuned"]["mean"], "vs_best_ft": v["vs_best_fixed"]["mean"],
                "best_ft": pk["best_fixed"][k], "best_ft_acc": pk["rows"][pk["best_fixed"][k]][k]["mean"],
                "tuned_acc": pk["rows"]["ft-tuned"][k]["mean"]} for k, v in pk["rows"][m].items()}


def kind_report(cell: str, rows: dict) -> list[str]:
    """One table per cell with kinds: per variant, pool and kind, the learned row's accuracy and its paired Δs (mean ±
    SD over meta-train seeds), the kind's best fixed FT and ft-tuned, and a mark where a kind is left behind."""
    mine = {k: r for k, r in rows.items() if k[0] == cell and r.get("per_kind")}
    if not mine:
        return []
    out = ["", f"Per kind ({cell}): ✗ marks a kind below its best fixed FT or more than 2 points below FT tuned", "",
           "| variant | pool | kind | seeds | FedL2P | Δ vs FT tuned | Δ vs best fixed FT | FT tuned | best fixed FT | |",
           "|" + "---|" * 10]
    for variant in dict.fromkeys(k[1] for k in mine):
        for pool in ("seen", "unseen"):
            rs = [r for k, r in mine.items() if k[1] == variant and k[3] == pool]
            for kind in (sorted(rs[0]["per_kind"]) if rs else []):
                ks = [r["per_kind"][kind] for r in rs if kind in r["per_kind"]]
                tuned, best = np.mean([k["vs_tuned"] for k in ks]), np.mean([k["vs_best_ft"] for k in ks])
                acc = [100 * k["acc"] for k in ks]
                out.append(f"| {variant} | {pool} | {kind} | {len(ks)} | {np.mean(acc):.2f} ± {np.std(acc):.2f} | "
                           f"{ms([k['vs_tuned'] for k in ks])} | {ms([k['vs_best_ft'] for k in ks])} | "
                           f"{100 * np.mean([k['tuned_acc'] for k in ks]):.2f} | {ks[0]['best_ft']} "
                           f"{100 * np.mean([k['best_ft_acc'] for k in ks]):.2f} | {'✗' if best < 0 or tuned < -0.02 else ''} |")
    return out


def report(paths: list[Path]) -> str:
    """The rows of one or more --json files as one table per cell: per variant and pool, mean ± SD over meta-train
    seeds of accuracy, Δ vs ft-tuned and vs the best fixed FT, the same for its checked row, β per kind, split, ARI.
    A (cell, variant, seed, pool) found twice counts once (its newest row)."""
    rows = {}
    for p in paths:
        for line in p.read_text().splitlines():
            r = json.loads(line)
            rows[r["cell"], r["variant"], r["seed"], r["pool"]] = r
    out = []
    for cell in dict.fromkeys(k[0] for k in rows):
        out += [f"### {cell}", "", "| variant | pool | seeds | FedL2P | Δ vs FT tuned | Δ vs best fixed FT | checked: Δ vs FT "
                "tuned | checked: Δ vs best fixed FT | β per kind (bn0/bn1/bn2) | split | ARI |", "|" + "---|" * 11]
        for variant in dict.fromkeys(k[1] for k in rows if k[0] == cell):
            for pool in ("seen", "unseen"):
                rs = [r for k, r in rows.items() if k[0] == cell and k[1] == variant and k[3] == pool]
                if not rs:
                    continue
                f = lambda key, rs=rs: ms([r[key] for r in rs if key in r])  # noqa: E731
                kinds = sorted(rs[0]["beta_per_kind"])
                beta = " · ".join("/".join(f"{np.mean([r['beta_per_kind'][k][i] for r in rs]):.2f}"
                                           for i in range(len(rs[0]["beta_per_kind"][k]))) for k in kinds)
                acc = [100 * r["acc"] for r in rs]
                out.append(f"| {variant} | {pool} | {len(rs)} | {np.mean(acc):.2f} ± {np.std(acc):.2f} | {f('vs_tuned')} | "
                           f"{f('vs_best_ft')} | "
                           f"{f('checked_vs_tuned')} | {f('checked_vs_best_ft')} | {beta} | {np.mean([r['split'] for r in rs]):.2f} | "
                           f"{np.mean([r['ari'] for r in rs]):.2f} |")
        for pool in ("seen", "unseen"):
            base = next(iter(r for k, r in rows.items() if k[0] == cell and k[3] == pool), None)
            if base is not None:
                out.append(f"{pool} pool: FT tuned {100 * base['tuned_acc']:.2f} ± {100 * base['tuned_sd']:.2f}, best fixed "
                           f"FT ({base['best_ft']}) {100 * base['best_ft_acc']:.2f}.  ")
        out += kind_report(cell, rows)
        out.append("")
    return "\n".join(out)


def ms(v: list[float]) -> str:
    """Points: mean ± SD (one value: the value)."""
    if not v:
        return ""
    return f"{100 * np.mean(v):+.2f} ± {100 * np.std(v):.2f}" if len(v) > 1 else f"{100 * v[0]:+.2f}"


def main() -> None:
    if sys.argv[1:2] == ["report"]:
        print(report([Path(p) for p in sys.argv[2:]]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cells", help="comma-separated bench cells (pipelines/bench/CELL.toml)")
    ap.add_argument("variants", nargs="+", help="name:key=value[,key=value...]")
    ap.add_argument("--seeds", default="0", help="meta-train seeds, comma-separated")
    ap.add_argument("--json", type=Path, default=None, help="append the rows here (JSON lines)")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    for cell in args.cells.split(","):
        t0 = time.time()
        base = baselines(cell)
        print(f"[{cell}] baselines {base} ({time.time() - t0:.0f} s)", flush=True)
        for text in args.variants:
            name, settings = parse(text)
            for seed in seeds:
                t0 = time.time()
                ids = variant(cell, settings, seed)
                for pool in ("seen", "unseen"):
                    row = {"cell": cell, "variant": name, "settings": settings, "seed": seed, "pool": pool}
                    row |= score(base[f"personalize:{pool}"], ids[f"personalize:{pool}"])
                    print(json.dumps(row), flush=True)
                    if args.json:
                        with args.json.open("a") as f:
                            f.write(json.dumps(row) + "\n")
                print(f"[{cell}] {name} seed {seed}: {time.time() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
