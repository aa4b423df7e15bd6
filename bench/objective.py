"""`python bench/objective.py [CELL]`: does meta-training lower the objective it descends, on every client at once?

The validation loss a meta-train run records per round is the mean over that round's *sampled* clients (a quarter
of the seen pool), each scored under the lambda it received: rounds see different clients, so its course mixes the
lambda's progress with which clients were drawn, and `--keep best` keeps the round whose sample scored lowest. This
script scores lambdas on one fixed footing: every seen client, the same fine-tuning batches for every lambda (the
meta-objective of Alg. 1: fine-tune e epochs under (beta, eta), then the loss on the client's whole validation split),
and the same clients' test split beside it. Lambdas: the initial one (round 0), and each `bench/budget.py` run's
kept lambda (`--keep best` and `--keep last` at every round count), per meta-train seed. Differences are paired on
clients.

It also fits the recorded per-round validation loss against the round number with one effect per domain (the
sampled clients' domain mix), so a trend is told apart from the draw.

Writes bench/objective.md and bench/objective.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

from fedl2p_cli import plugins
from fedl2p_cli.analysis import tables

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import accuracy  # noqa: E402
import budget  # noqa: E402

EVAL_SEED = 1000  # fine-tuning batches of the scoring: the same for every lambda, independent of any run's seeds


def score(ctx, lam, beta: list[float] | None = None) -> dict[str, np.ndarray]:
    """Per seen client: validation loss (the meta-objective), validation and test accuracy under lambda (`beta`: one
    fixed beta per BN layer instead of BNNet's)."""
    import torch

    from fedl2p_cli.algorithms.fedl2p import hyper_fn
    from fedl2p_cli.core.finetune import Strategy, finetune, personalized_accuracy
    from fedl2p_cli.engine.loop import generator
    cfg = ctx.cfg.meta
    out: dict[str, list[float]] = {"val_loss": [], "val_acc": [], "test_loss": [], "test_acc": []}
    for c in ctx.part.pool(False):
        data = ctx.part.client_on(c, torch.device("cpu"))
        with torch.no_grad():
            b, eta = hyper_fn(*ctx.inputs(c), len(ctx.theta_g), cfg)(lam)
        s = Strategy(b if beta is None else torch.tensor(beta, dtype=b.dtype), eta)
        ft = finetune(ctx.model, ctx.theta_g, *data.train, s, ctx.stats.client_bn(c), cfg.epochs, cfg.batch_size,
                      generator(EVAL_SEED, c), cfg.client_bn)
        for split, (x, y) in (("val", data.val), ("test", data.test)):
            loss, acc = personalized_accuracy(ctx.model, ft.params, x, y, s, ft.bn, cfg.batch_size, cfg.val_stats)
            out[f"{split}_loss"].append(loss)
            out[f"{split}_acc"].append(acc)
    return {k: np.array(v) for k, v in out.items()}


def domain_trend(art, domains: np.ndarray) -> tuple[float, float]:
    """Slope (per 10 rounds) of the recorded validation loss with one intercept per domain share of the sample,
    and its standard error (ordinary least squares)."""
    with open(art.file("history.csv")) as f:
        h = list(csv.DictReader(f))
    n_dom = int(domains.max()) + 1
    rows, y = [], []
    for rec in h:
        sampled = [int(c) for c in rec["sampled"].split()]
        share = np.bincount(domains[sampled], minlength=n_dom) / len(sampled)
        rows.append([*share, int(rec["round"]) / 10])
        y.append(float(rec["val_loss"]))
    a, y = np.array(rows), np.array(y)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    resid = y - a @ coef
    dof = max(1, len(y) - np.linalg.matrix_rank(a))
    cov = (resid @ resid / dof) * np.linalg.pinv(a.T @ a)
    return float(coef[-1]), float(np.sqrt(cov[-1, -1]))


def runs(cell: str) -> list:
    """The budget runs' meta-train artifacts (each once), from bench/budget-ids.json."""
    from fedl2p_cli.artifacts import Store
    store = Store(accuracy.STORE)
    seen: dict[str, object] = {}
    for ids in budget._done(cell).values():
        for pid in ids:
            for r in accuracy.meta_runs(pid):
                seen.setdefault(r["id"], store.load("meta-train", r["id"], verify=False))
    return list(seen.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cell", nargs="?", default="fs-1000", choices=list(accuracy.CELLS))
    ap.add_argument("--report", action="store_true", help="only rewrite the report from bench/objective.json")
    ap.add_argument("--layers", action="store_true", help="only score fixed betas per BN layer (LAYER_BETAS), added "
                    "to bench/objective.json")
    args = ap.parse_args()
    if args.report:
        d = json.loads((HERE / "objective.json").read_text())
        print(report(d["lambdas"]) + "\n\n" + sweep_report(d["beta_sweep"]) + "\n\n" + sweep_report(d.get("layers", [])))
        return
    if args.layers:  # only the per-layer sweep, added to an existing objective.json
        d = json.loads((HERE / "objective.json").read_text())
        d["layers"] = sweep(*context(runs(args.cell)[0]), LAYER_BETAS)
        (HERE / "objective.json").write_text(json.dumps(d, indent=1))
        print(sweep_report(d["layers"]))
        return
    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.stages import meta_train
    arts = runs(args.cell)
    if not arts:
        raise SystemExit(f"objective: no bench/budget.py run of {args.cell} yet")
    results, ctxs = [], {}
    for art in sorted(arts, key=lambda a: (a.metrics["variant"], a.config["rounds"])):
        cfg = meta_train.config_from_dict(art.config)
        key = (art.parents["pretrain"], art.parents["partition"], art.parents["stats"], cfg.seed, art.config["meta"]["meta_grad"])
        if key not in ctxs:  # one context (and one round-0 score) per meta-train seed and meta-gradient
            ctx, lam0 = context(art)
            ctxs[key] = (ctx, lam0, score(ctx, lam0))
            results.append({"variant": budget.label(art.metrics["variant"].split("-seed")[0])[0], "seed": cfg.seed,
                            "rounds": 0, "keep": "initial", **{k: v.tolist() for k, v in ctxs[key][2].items()}})
        ctx = ctxs[key][0]
        _, lam, _ = meta_train.load_lambda(Store(accuracy.STORE), art.id, plugins.current())
        sc = score(ctx, lam)
        slope, se = domain_trend(art, np.asarray(ctx.part.domain))
        results.append({"variant": budget.label(art.metrics["variant"].split("-seed")[0])[0], "seed": cfg.seed,
                        "rounds": art.config["rounds"], "keep": art.config["keep"],
                        "kept_round": art.metrics.get("kept_round"), "trend_per_10_rounds": slope, "trend_se": se,
                        **{k: v.tolist() for k, v in sc.items()}})
        print(f"scored {art.metrics['variant']} ({art.config['rounds']} rounds, keep {art.config['keep']})", flush=True)
    ctx, lam0, _ = next(iter(ctxs.values()))
    uniform = sweep(ctx, lam0, [(b,) * ctx.stats.xi.shape[1] for b in BETAS])
    (HERE / "objective.json").write_text(json.dumps({"lambdas": results, "beta_sweep": uniform}, indent=1))
    text = report(results) + "\n\n" + sweep_report(uniform)
    (HERE / "objective.md").write_text(text + "\n")
    print(text)


BETAS = (0.0, 0.25, 0.5, 0.75, 1.0)
# per BN layer: the learned course on fs-1000 (bn0 up, bn2 down) against one beta for all; `--layers`
LAYER_BETAS = ((1.0, 1.0, 1.0), (1.0, 1.0, 0.3), (0.94, 0.6, 0.3), (0.94, 0.6, 1.0), (0.6, 0.6, 0.45), (0.5, 0.5, 0.5))


def context(art):
    """A meta-train run's client context (its partition, pretrained model and statistics, one torch thread) and its
    initial lambda."""
    import torch

    from fedl2p_cli.stages import meta_train
    torch.set_num_threads(1)
    cfg = meta_train.config_from_dict(art.config)
    ctx = meta_train.make_context(str(accuracy.STORE), art.parents["pretrain"], art.parents["partition"],
                                  art.parents["stats"], cfg, accuracy.handed())
    return ctx, meta_train.initial_lambda(cfg, ctx.entries.head, ctx.stats.xi.shape[1], ctx.stats.x.shape[1], len(ctx.theta_g))


def sweep(ctx, lam0, betas) -> list[dict]:
    """The meta-objective and test accuracy at fixed betas, one per BN layer, with the initial LRNet's learning
    rates: does the validation loss the meta-gradient descends prefer the betas that test best?"""
    out = []
    for b in betas:
        out.append({"beta": list(b), **{k: v.tolist() for k, v in score(ctx, lam0, list(b)).items()}})
        print(f"scored beta = {b}", flush=True)
    return out


def sweep_report(sweep: list[dict]) -> str:
    """Means over the clients whose loss is finite (at beta 0 a client may diverge: counted in the last column)."""
    cols = ["β (every layer)", "val. loss, all seen clients", "val. acc.", "test loss", "test acc.",
            "clients with a non-finite loss"]
    rows = []
    for r in sweep:
        bad = int(np.sum(~np.isfinite(r["val_loss"]) | ~np.isfinite(r["test_loss"])))
        beta = " / ".join(f"{b:g}" for b in r["beta"]) if isinstance(r["beta"], list) else f"{r['beta']:g}"
        rows.append([beta, f"{np.nanmean(np.where(np.isfinite(r['val_loss']), r['val_loss'], np.nan)):.3f}",
                     f"{100 * np.mean(r['val_acc']):.2f}",
                     f"{np.nanmean(np.where(np.isfinite(r['test_loss']), r['test_loss'], np.nan)):.3f}",
                     f"{100 * np.mean(r['test_acc']):.2f}", f"{bad} of {len(r['val_loss'])}"])
    return tables.markdown(cols, rows)


def report(results: list[dict]) -> str:
    """Per variant, round count and keep: the all-client validation loss and test accuracy, paired against round 0
    of the same meta-train seed; mean ± SD over seeds."""
    base = {(r["variant"], r["seed"]): r for r in results if r["rounds"] == 0}
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["variant"], r["rounds"], r["keep"]), []).append(r)
    cols = ["variant", "rounds", "keep", "kept round per seed", "val. loss, all seen clients", "Δ vs round 0", "test acc.",
            "Δ vs round 0", "recorded val. loss trend per 10 rounds, domain-adjusted"]

    def ms(xs) -> str:
        return f"{np.mean(xs):.3f} ± {np.std(xs):.3f}"
    rows = []
    for (variant, rounds, keep), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        vl = [np.mean(r["val_loss"]) for r in rs]
        ta = [100 * np.mean(r["test_acc"]) for r in rs]
        dvl = [np.mean(np.subtract(r["val_loss"], base[(variant, r["seed"])]["val_loss"])) for r in rs]
        dta = [100 * np.mean(np.subtract(r["test_acc"], base[(variant, r["seed"])]["test_acc"])) for r in rs]
        kept = " / ".join(str(r.get("kept_round", "")) for r in rs) if rounds else ""
        trend = " / ".join(f"{r['trend_per_10_rounds']:+.3f} ± {r['trend_se']:.3f}" for r in rs) if rounds else ""
        dv = f"{np.mean(dvl):+.3f} ± {np.std(dvl):.3f}" if rounds else ""
        da = f"{np.mean(dta):+.2f} ± {np.std(dta):.2f}" if rounds else ""
        rows.append([variant, rounds, keep, kept, ms(vl), dv, f"{np.mean(ta):.2f} ± {np.std(ta):.2f}", da, trend])
    return tables.markdown(cols, rows)

if __name__ == "__main__":
    main()
