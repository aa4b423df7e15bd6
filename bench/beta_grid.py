"""Does a bench cell's data ask for a per-domain beta? `python bench/beta_grid.py CELL [OPTIONS]`.

Builds (or reuses) the cell's partition, pretrained model and statistics, then runs `fedl2p analyze beta-grid --stats
ID [OPTIONS]` on them in the bench store: OPTIONS are that command's (--lr LR, --levels 0,1, --seeds 0,1,2, ...; see
`fedl2p analyze beta-grid --help`). It prints the command's table; the artifact (analyze/ID: scores.json,
summary.md/json) keeps the result."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy  # noqa: E402  (the cells' definitions)

USAGE = f"usage: python bench/beta_grid.py CELL [options of `fedl2p analyze beta-grid`]; cells: {', '.join(accuracy.CELLS)}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if not argv or argv[0] not in accuracy.CELLS:
        print(f"error: the first argument is a cell; {USAGE}", file=sys.stderr)
        return 2
    from fedl2p_cli.cli.main import run_cli
    ids = accuracy.prerequisites(argv[0])
    return run_cli(["analyze", "beta-grid", "--store", str(accuracy.STORE), "--stats", ids["stats"],
                    "--epochs", str(accuracy.EPOCHS), *argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
