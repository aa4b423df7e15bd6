"""Which half of a learned strategy helps: `python bench/decompose.py PERSONALIZE_ID [--beta B]`.

A FedL2P strategy is a pair (beta, eta) per client. This re-runs the personalisation's learned method on the same
clients, seeds and batches with one half swapped for a fixed choice -- beta fixed at B for every BN layer (default:
the meta-train's `beta_init`), eta at the base LR for every tensor -- and prints the four combinations side by side
with paired differences to the learned strategy; `--eta-scales` adds the learned strategy with its LRs scaled (does
the pool want more or less fine-tuning?). Then the learned eta's ratio to the base LR per parameter tensor (mean,
min and max over the pool's clients). Test-time statistics are the personalisation's own (`eval_stats`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy  # noqa: E402  (the store and cell_inputs)


def combos(beta: np.ndarray, eta: np.ndarray, b_fixed: float, base_lr: float, scales: list[float]) -> dict[str, tuple]:
    fixed_b, base_e = np.full_like(beta, b_fixed), np.full_like(eta, base_lr)
    out = {"learned beta, learned eta": (beta, eta), "learned beta, base LR": (beta, base_e),
           f"beta {b_fixed:g}, learned eta": (fixed_b, eta), f"beta {b_fixed:g}, base LR": (fixed_b, base_e)}
    return out | {f"learned beta, learned eta x {s:g}": (beta, eta * np.float32(s)) for s in scales}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("personalize", help="a personalize artifact id (with one learned method)")
    ap.add_argument("--beta", type=float, default=None, help="the fixed beta (default: the meta-train's beta_init)")
    ap.add_argument("--eta-scales", default="", help="comma-separated factors: also the learned strategy with every "
                    "learned LR times each (does this pool want more or less fine-tuning than it was given?)")
    args = ap.parse_args()
    scales = [float(v) for v in args.eta_scales.split(",") if v.strip()]
    import torch
    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.core.finetune import Strategy, finetune, personalized_accuracy
    from fedl2p_cli.engine.loop import generator
    from fedl2p_cli import methods
    from fedl2p_cli.methods import label
    from fedl2p_cli.stages import personalize as pers_stage
    torch.set_num_threads(1)
    from fedl2p_cli.errors import FedL2PError
    store = Store(accuracy.STORE)
    try:
        art, r = pers_stage.load(store, args.personalize)
    except FedL2PError as e:  # a wrong id: one line, not a traceback
        sys.exit(f"error: personalize: {e}")
    meta = [m for m in r.methods if isinstance(methods.get(m), methods.Learned)][0]
    meta_art = store.load("meta-train", [a for k, a in art.parents.items() if k.startswith("meta-train")][0])
    b_fixed = args.beta if args.beta is not None else float(meta_art.config["meta"].get("beta_init", 0.5))
    model, theta, table, part = accuracy.cell_inputs(art.parents)
    cfg = art.config
    base_lr, epochs, bs, stats = float(cfg["base_lr"]), int(cfg["epochs"]), int(cfg["batch_size"]), cfg.get("eval_stats", "running")
    per_client = [combos(r.beta[meta][j], r.eta[meta][j], b_fixed, base_lr, scales) for j in range(len(r.client))]
    names = list(per_client[0])
    acc = np.full((len(names), len(r.seeds), len(r.client)), np.nan)
    for j, c in enumerate(int(c) for c in r.client):
        data = part.client(c)
        for i, (b, e) in enumerate(per_client[j].values()):
            s = Strategy(torch.from_numpy(b), torch.from_numpy(e))
            for k, seed in enumerate(r.seeds):
                ft = finetune(model, theta, *data.train, s, table.client_bn(c), epochs, bs, generator(seed, c, 7),
                              cfg.get("client_bn", "precise"))
                acc[i, k, j] = personalized_accuracy(model, ft.params, *data.test, s, ft.bn, bs, stats)[1]
        print(f"client {c} done", file=sys.stderr, flush=True)
    m = 100 * acc.mean(axis=2)  # [combo, seed], percent
    stored = 100 * r.acc_after[r.methods.index(meta)].mean(axis=1)
    print(f"{meta} on {len(r.client)} {r.pool} clients, {len(r.seeds)} seeds, eval_stats {stats} "
          f"(stored: {stored.mean():.2f} ± {stored.std():.2f})\n")
    print("| strategy | accuracy | Δ vs learned (paired) |\n|---|---|---|")
    for i, n in enumerate(names):
        d = m[i] - m[0]
        print(f"| {n} | {m[i].mean():.2f} ± {m[i].std():.2f} | {d.mean():+.2f} ± {d.std():.2f} |")
    for h in (b for b in methods.baselines() if b in r.methods):
        v = 100 * r.acc_after[r.methods.index(h)].mean(axis=1)
        print(f"| {label(h)} (stored) | {v.mean():.2f} ± {v.std():.2f} | |")
    ratio = r.eta[meta] / base_lr
    print("\nlearned eta / base LR per tensor (mean [min, max] over clients); learned beta mean per BN layer: "
          + " / ".join(f"{v:.2f}" for v in r.beta[meta].mean(0)))
    for p, col in zip(table.param_names, ratio.T):
        print(f"  {p:28s} {col.mean():.2f} [{col.min():.2f}, {col.max():.2f}]")


if __name__ == "__main__":
    main()
