"""Does a bench cell's data ask for a per-domain beta? `python bench/beta_grid.py CELL [--lr LR] [--levels 0,1]
[--seeds 0,1,2]`: `fedl2p analyze beta-grid` on the cell's statistics (partition, pretrained model and statistics
built or reused first), then its report. The artifact (analyze/ID: scores.json, summary.md/json) keeps the result."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy  # noqa: E402  (the cells' definitions)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cell", choices=list(accuracy.CELLS))
    ap.add_argument("--lr", type=float, default=accuracy.BASE_LR, help="learning rate of every tensor")
    ap.add_argument("--levels", default="0,0.5,1", help="comma-separated beta levels; the grid is levels^(BN layers)")
    ap.add_argument("--seeds", default="0", help="comma-separated batch-order seeds of the fine-tuning")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.cli.render import RichProgress
    from fedl2p_cli.configs import BetaGridConfig
    from fedl2p_cli.stages import beta_grid
    ids = accuracy.prerequisites(args.cell)
    cfg = BetaGridConfig(lr=args.lr, levels=[float(v) for v in args.levels.split(",")], seeds=[int(v) for v in args.seeds.split(",")],
                         epochs=accuracy.EPOCHS)
    art, _ = beta_grid.run(cfg, Store(accuracy.STORE), ids["stats"], progress=RichProgress())
    print(f"\n{args.cell}: analyze/{art.id}\n\n" + art.file("summary.md").read_text())


if __name__ == "__main__":
    main()
