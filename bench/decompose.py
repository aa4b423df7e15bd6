"""Which half of a learned strategy helps: `python bench/decompose.py PERSONALIZE_ID [OPTIONS]`.

Runs `fedl2p analyze decompose --personalize PERSONALIZE_ID [OPTIONS]` on the bench store (artifacts/ or
$FEDL2P_STORE): OPTIONS are that command's (--beta B, --eta-scales 0.5,2, --layer-betas 0,1, --method M; see
`fedl2p analyze decompose --help`). It prints the command's table; the artifact (analyze/ID: summary.md/json) keeps
the whole report."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy  # noqa: E402  (the bench store)

USAGE = "usage: python bench/decompose.py PERSONALIZE_ID [options of `fedl2p analyze decompose`]"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if not argv or argv[0].startswith("-"):
        print(f"error: the first argument is a personalize artifact id; {USAGE}", file=sys.stderr)
        return 2
    from fedl2p_cli.cli.main import run_cli
    return run_cli(["analyze", "decompose", "--store", str(accuracy.STORE), "--personalize", argv[0], *argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
