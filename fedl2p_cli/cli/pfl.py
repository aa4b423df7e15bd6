from __future__ import annotations

from pathlib import Path

from ..configs import PFLConfig
from ..runtime import Runtime, round_options
from . import options, render
from .generate import config_command

stage = options.Lazy("fedl2p_cli.stages.pfl")


@config_command(PFLConfig, runtime=round_options())
def pfl_train(
    cfg: PFLConfig,
    rt: Runtime,
    partition: str | None = options.PARTITION,
    resume: bool = options.RESUME,
    force: bool = options.FORCE,
    store: Path | None = options.STORE,
) -> None:
    """Train a personalised-FL system (pFedLA, HeurpFedLA, CAFeMe or a plugin's) on the seen clients -> a pfl artifact
    that `fedl2p personalize --methods` evaluates beside FT and FedL2P (pFedLA has no model for unseen clients)."""
    art, reused = options.execute(stage, cfg, {"partition": partition}, store, rt, force,
                                  progress=render.RichProgress(), resume=resume)
    render.table(f"pfl-train ({cfg.algo})", ["metric", "value"], [[k_, v] for k_, v in art.metrics.items()])
    render.artifact_line("pfl", art.id, art.path, reused)
