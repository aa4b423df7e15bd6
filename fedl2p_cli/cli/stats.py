from __future__ import annotations

from pathlib import Path

import typer

from ..configs import StatsConfig
from ..runtime import Runtime
from . import options, render
from .generate import config_command

stage = options.Lazy("fedl2p_cli.stages.stats")


@config_command(StatsConfig)
def stats(
    cfg: StatsConfig,
    rt: Runtime,
    pretrain: str | None = options.PRETRAIN,
    partition: str | None = typer.Option(None, "--partition", help="Partition artifact id; default: the model's own."),
    force: bool = options.FORCE,
    store: Path | None = options.STORE,
) -> None:
    """Per-client layer-input moments, BN statistics and KL distances xi (Eq. 3) -> stats.h5."""
    art, reused = options.execute(stage, cfg, {"partition": partition, "pretrain": pretrain}, store, rt, force,
                                  progress=render.RichProgress())
    show(art.metrics)
    render.artifact_line("stats", art.id, art.path, reused)


def show(m: dict) -> None:
    names = m["bn_layers"]
    rows = [[d] + v for d, v in m["mean_xi_per_domain"].items()]
    render.table(f"mean xi (symmetric KL to the pretrained BN statistics) per domain, {m['clients']} clients",
                 ["domain"] + [f"bn{i}" for i in range(len(names))], rows)
