from __future__ import annotations

from pathlib import Path

import typer

from ..configs import PretrainConfig
from ..runtime import Runtime, round_options
from . import options, render
from .generate import config_command

stage = options.Lazy("fedl2p_cli.stages.pretrain")


@config_command(PretrainConfig, runtime=round_options())
def pretrain(
    cfg: PretrainConfig,
    rt: Runtime,
    partition: str | None = typer.Option(None, "--from", help="Partition artifact id (prefix); default: the newest."),
    resume: bool = options.RESUME,
    force: bool = options.FORCE,
    store: Path | None = options.STORE,
) -> None:
    """Pretrain the global model federatedly on the seen clients -> model.safetensors, history.csv, curves.png."""
    art, reused = options.execute(stage, cfg, {"partition": partition}, store, rt, force,
                                  progress=render.RichProgress(), resume=resume)
    if art.metrics:
        render.table("global model", ["metric", "value"], [[k, v] for k, v in art.metrics.items()])
    render.artifact_line("pretrain", art.id, art.path, reused)
