"""Does the data ask for a per-domain beta? `python bench/beta_grid.py CELL [--lr LR] [--levels 0,0.5,1]`.

Fine-tunes every seen client of a bench-accuracy cell once per beta *vector* on a grid (every BN layer its own level,
levels^B vectors), with PreciseBN client statistics, the cell's epochs and batch size and a fixed LR for every tensor,
and compares three ways of choosing beta, each picked on the clients' *validation* splits and scored on their test
splits (the same fine-tuned models):
  shared      one vector for every client (what a meta-net that ignores xi can learn),
  per domain  one vector per true domain (what a meta-net that separates the domains, ARI 1, can learn),
  per client  each client's own vector (any meta-net's bound from these levels).
If "per domain" is not above "shared", a beta that differs by domain has nothing to gain in this cell, and the
meta-nets learning one beta for all domains is the right answer rather than a failure to learn.
Reuses the cell's partition, pretrained model and statistics (built if missing).
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy  # noqa: E402  (the cells' definitions)


def client_scores(ids: dict[str, str], clients: list[int], grid: list[tuple[float, ...]], lr: float,
                  seed: int) -> dict[int, list[list[float]]]:
    """{client: [[val acc, test acc] per grid vector]}."""
    import torch
    from fedl2p_cli.core.finetune import Strategy, finetune, personalized_accuracy
    from fedl2p_cli.engine.loop import generator
    torch.set_num_threads(1)
    model, theta, table, part = accuracy.cell_inputs(ids)
    out = {}
    for c in clients:
        data, row = part.client(c), []
        for vec in grid:
            s = Strategy(torch.tensor(vec, dtype=torch.float32), torch.full((len(theta),), lr))
            ft = finetune(model, theta, *data.train, s, table.client_bn(c), accuracy.EPOCHS, 32, generator(seed, c, 7))
            row.append([personalized_accuracy(model, ft.params, *split, s, ft.bn, 32)[1] for split in (data.val, data.test)])
        out[c] = row
    return out


def choose(scores: np.ndarray, groups: np.ndarray, split: int = 0) -> np.ndarray:
    """Per group, the grid index with the best mean accuracy on `split` (0 validation, 1 test); each client's pick."""
    pick = np.empty(len(groups), dtype=int)
    for g in np.unique(groups):
        m = groups == g
        pick[m] = int(np.argmax(scores[m, :, split].mean(0)))
    return pick


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cell", choices=list(accuracy.CELLS))
    ap.add_argument("--lr", type=float, default=accuracy.BASE_LR, help="learning rate of every tensor")
    ap.add_argument("--levels", default="0,0.5,1", help="comma-separated beta levels; the grid is levels^(BN layers)")
    ap.add_argument("--seed", type=int, default=0, help="batch-order seed of the fine-tuning")
    ap.add_argument("--jobs", type=int, default=2, help="processes (one torch thread each)")
    ap.add_argument("--out", type=Path, default=None, help="also write the per-client scores as JSON here")
    ap.add_argument("--load", type=Path, default=None, help="report from scores an earlier --out wrote (no fine-tuning)")
    args = ap.parse_args()
    data = json.loads(args.load.read_text()) if args.load else compute(args)
    if args.out and not args.load:
        args.out.write_text(json.dumps(data))
    report(data)


def compute(args: argparse.Namespace) -> dict:
    ids = accuracy.prerequisites(args.cell)
    _, _, table, part = accuracy.cell_inputs(ids)
    levels = [float(v) for v in args.levels.split(",")]
    grid = list(itertools.product(levels, repeat=table.xi.shape[1]))
    clients = part.pool(False)
    chunks = [clients[i::args.jobs] for i in range(args.jobs)]
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        parts = pool.starmap(client_scores, [(ids, ch, grid, args.lr, args.seed) for ch in chunks])
    by_client = {c: v for p in parts for c, v in p.items()}
    return {"cell": args.cell, "lr": args.lr, "seed": args.seed, "grid": grid, "clients": clients,
            "domain": [part.domain_names[part.domain[c]] for c in clients],
            "scores": (np.array([by_client[c] for c in clients]) * 100).tolist()}  # [clients, grid, (val, test)]


def report(data: dict) -> None:
    scores, domain, grid = np.array(data["scores"]), np.array(data["domain"]), data["grid"]
    clients = data["clients"]
    groups = {"shared": np.zeros(len(clients)), "per domain": domain, "per client": np.arange(len(clients))}
    rows = {k: choose(scores, g) for k, g in groups.items()}
    test = lambda pick: scores[np.arange(len(clients)), pick, 1].mean()  # noqa: E731
    print(f"\n{data['cell']}, LR {data['lr']:g}, {len(grid)} beta vectors, {len(clients)} seen clients, seed {data['seed']}; "
          "test accuracy of each choice\n\n| choice | chosen on validation | Δ vs shared | chosen on test (bound) "
          "| Δ vs shared (bound) |\n|---|---|---|---|---|")
    for name, g in groups.items():
        bound = choose(scores, g, 1)
        print(f"| {name} | {test(rows[name]):.2f} | {test(rows[name]) - test(rows['shared']):+.2f} | {test(bound):.2f} "
              f"| {test(bound) - test(choose(scores, groups['shared'], 1)):+.2f} |")
    print("\n| domain | vector chosen (per domain) | its test acc. | shared vector's test acc. |\n|---|---|---|---|")
    for d in dict.fromkeys(domain):
        m = domain == d
        acc = lambda pick: scores[np.arange(len(clients)), pick, 1][m].mean()  # noqa: E731
        print(f"| {d} | {' / '.join(f'{b:g}' for b in grid[rows['per domain'][m][0]])} | {acc(rows['per domain']):.2f} "
              f"| {acc(rows['shared']):.2f} |")
    print(f"\nshared vector: {' / '.join(f'{b:g}' for b in grid[rows['shared'][0]])}")


if __name__ == "__main__":
    main()
