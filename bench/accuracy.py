"""`make bench-accuracy`: the embedded benchmark at alpha in {1000, 1.0, 0.1}, 3 seeds, all methods.

Runs pipelines/quickstart.toml with alpha and seeds overridden (reusing artifacts that exist) and writes the
Table-2/3 style comparison to bench/accuracy.md and bench/accuracy.json.
"""

from __future__ import annotations

import copy
import json
import sys
import tomllib
from pathlib import Path

from fedl2p_cli.cli.render import RichProgress
from fedl2p_cli.stages import pipeline
from fedl2p_cli.stages.personalize import LABELS

HERE = Path(__file__).resolve().parent
ALPHAS = (1000.0, 1.0, 0.1)


def main() -> None:
    base = tomllib.loads((HERE.parent / "pipelines" / "quickstart.toml").read_text())
    rows = []
    for alpha in [float(a) for a in sys.argv[1:]] or ALPHAS:
        sections = copy.deepcopy(base)
        sections["partition"]["alpha"] = alpha
        sections["personalize"]["seeds"] = [0, 1, 2]
        p = pipeline.Pipeline(f"accuracy-alpha{alpha:g}", sections, pipeline.Store(Path("artifacts")))
        for r in pipeline.run(p, None, RichProgress):
            if r.stage == "personalize":
                s = json.loads(r.artifact.file("summary.json").read_text())
                rows.append({"alpha": alpha, **s})
                print(f"alpha {alpha:g} {s['pool']}: " + ", ".join(f"{m} {100 * v['mean']:.2f}" for m, v in s["methods"].items()),
                      flush=True)
    (HERE / "accuracy.json").write_text(json.dumps(rows, indent=2))
    methods = list(dict.fromkeys(m for r in rows for m in r["methods"]))
    lines = ["Embedded benchmark (Fashion-MNIST-C, small CNN): personalised test accuracy (%), mean ± SD over 3 seeds", "",
             "| α | pool | global | " + " | ".join(LABELS.get(m, m) for m in methods) + " |",
             "|---" * (3 + len(methods)) + "|"]
    for r in rows:
        cells = [f"{100 * r['methods'][m]['mean']:.2f} ± {100 * r['methods'][m]['sd']:.2f}" if m in r["methods"] else "–"
                 for m in methods]
        lines.append(f"| {r['alpha']:g} | {r['pool']} | {100 * r['global_acc']:.2f} | " + " | ".join(cells) + " |")
    (HERE / "accuracy.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
