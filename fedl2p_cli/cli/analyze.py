from __future__ import annotations

import json
from pathlib import Path

import typer

from ..analysis.text import signed
from ..configs import BetaGridConfig, ClustersConfig, DecomposeConfig
from ..runtime import Runtime
from . import options, render
from .generate import config_command
from .options import StoreRuntime

stage = options.Lazy("fedl2p_cli.stages.analyze")
grid_stage = options.Lazy("fedl2p_cli.stages.beta_grid")
decompose_stage = options.Lazy("fedl2p_cli.stages.decompose")

app = typer.Typer(help="Analyses of personalisation results.", no_args_is_help=True)


@app.command()
@config_command(ClustersConfig)
def clusters(
    cfg: ClustersConfig,
    rt: StoreRuntime,
    personalize: str | None = options.PERSONALIZE,
    force: bool = options.FORCE,
    store: Path | None = options.STORE,
) -> None:
    """Spectral clustering of clients by xi, x, beta, eta; ARI vs true domains; distance maps (PNG)."""
    art, reused = options.execute(stage, cfg, {"personalize": personalize}, store, rt, force)
    a = json.loads(art.file("ari.json").read_text())
    render.table(f"ARI vs true domains ({a['pool']} clients; outputs of {a['method']})", ["feature", "ARI"],
                 [[k, v] for k, v in a["ari"].items()])
    if a.get("method") and a.get("spread"):  # an artifact made before the spread was recorded has none
        from ..analysis.spread import lines
        for line in lines(a["method"], a["spread"]):
            print(line, flush=True)
    render.artifact_line("analyze", art.id, art.path, reused)


@app.command("beta-grid", epilog="Example: fedl2p analyze beta-grid --lr 0.01 --levels 0,1 --seeds 0,1,2")
@config_command(BetaGridConfig)
def beta_grid(
    cfg: BetaGridConfig,
    rt: Runtime,
    stats: str | None = typer.Option(None, "--stats", help="Stats artifact id (its partition and pretrained model); "
                                        "default: the newest."),
    force: bool = options.FORCE,
    store: Path | None = options.STORE,
) -> None:
    """Does the data ask for a per-domain beta, before any training? Fine-tunes every seen client under each beta
    vector of a grid and compares one vector for all clients, one per domain and one per client, each chosen on
    validation and scored on test -> summary.md/json, scores.json."""
    art, reused = options.execute(grid_stage, cfg, {"stats": stats}, store, rt, force, progress=render.RichProgress())
    s = json.loads(art.file("summary.json").read_text())
    render.table(f"test accuracy (%) by how beta is chosen, LR {cfg.lr:g}, seeds {cfg.seeds}",
                 ["choice", "chosen on validation", "Δ vs shared", "chosen on test (bound)"],
                 [[k, f"{sum(v['val']) / len(v['val']):.2f}", signed(sum(v['gain']) / len(v['gain'])),
                   f"{sum(v['bound']) / len(v['bound']):.2f}"] for k, v in s["choices"].items()])
    render.artifact_line("analyze", art.id, art.path, reused)


@app.command("decompose", epilog="Example: fedl2p analyze decompose --eta-scales 0.5,2 --layer-betas 0,1")
@config_command(DecomposeConfig)
def decompose(
    cfg: DecomposeConfig,
    rt: Runtime,
    personalize: str | None = options.PERSONALIZE,
    force: bool = options.FORCE,
    store: Path | None = options.STORE,
) -> None:
    """Which half of a learned strategy helps: re-runs the personalisation's learned method on the same clients, seeds
    and batches with beta fixed, with eta at the base LR, with its LRs scaled and with one BN layer's beta set
    (--layer-betas), overall and per domain -> summary.md/json."""
    art, reused = options.execute(decompose_stage, cfg, {"personalize": personalize}, store, rt, force,
                                  progress=render.RichProgress())
    s = json.loads(art.file("summary.json").read_text())
    doms, cells = decompose_stage.domain_cells(s)  # one column per domain where there are several
    render.table(f"{s['method']}: accuracy (%) by strategy", ["strategy", "accuracy", "Δ vs learned", *doms],
                 [[n, f"{v['mean']:.2f} ± {v['sd']:.2f}", signed(v['vs_learned']), *cells[n]]
                  for n, v in s["combinations"].items()])
    render.artifact_line("analyze", art.id, art.path, reused)
