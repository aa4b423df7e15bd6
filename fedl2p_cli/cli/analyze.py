from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..configs import ClustersConfig
from . import options, render
from .generate import config_command

stage = options.Lazy("fedl2p_cli.stages.analyze")

app = typer.Typer(help="Analyses of personalisation results.", no_args_is_help=True)


@app.command()
@config_command(ClustersConfig)
def clusters(
    cfg: ClustersConfig,
    personalize: Optional[str] = typer.Option(None, "--personalize", help="Personalize artifact id; default: the newest."),
    force: bool = options.FORCE,
    store: Optional[Path] = options.STORE,
) -> None:
    """Spectral clustering of clients by xi, x, beta, eta; ARI vs true domains; distance maps (PNG)."""
    art, reused = stage.run(cfg, options.store(store), personalize, force)
    a = json.loads(art.file("ari.json").read_text())
    render.table(f"ARI vs true domains ({a['pool']} clients; outputs of {a['method']})", ["feature", "ARI"],
                 [[k, v] for k, v in a["ari"].items()])
    render.artifact_line("analyze", art.id, art.path, reused)
