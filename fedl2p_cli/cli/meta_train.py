from __future__ import annotations

from pathlib import Path

from ..configs import MetaTrainConfig
from ..runtime import Runtime, round_options
from . import options, render
from .generate import config_command

stage = options.Lazy("fedl2p_cli.stages.meta_train")


@config_command(MetaTrainConfig, runtime=round_options())
def meta_train(
    cfg: MetaTrainConfig,
    rt: Runtime,
    pretrain: str | None = options.PRETRAIN,
    stats: str | None = options.STATS,
    resume: bool = options.RESUME,
    force: bool = options.FORCE,
    store: Path | None = options.STORE,
) -> None:
    """Federatedly learn the meta-nets BNNet and LRNet (and eta~) -> lambda.safetensors, history.csv, val_loss.png,
    learning.png (beta per domain, eta per layer group and meta-gradient norms per round)."""
    art, reused = options.execute(stage, cfg, {"pretrain": pretrain, "stats": stats}, store, rt, force,
                                  progress=render.RichProgress(), resume=resume)
    show(art.metrics)
    render.artifact_line("meta-train", art.id, art.path, reused)


def show(m: dict) -> None:
    render.table(f"meta-training ({m['variant']})", ["metric", "value"],
                 [[k, v] for k, v in m.items() if k not in ("variant", "diverged", "kept", "split")])
    split = m.get("split")
    if split:  # each kind's strategy and the split between kinds, beside the initial lambda's (the round-0 control)
        r0, kept = split.get("round 0", {}), split.get("kept", {})
        render.table("strategy by kind: the initial lambda (round 0) and the kept one", ["", "round 0", "kept"],
                     [[k, r0.get(k, ""), kept.get(k, "")] for k in dict.fromkeys([*r0, *kept])])
    kept = m.get("kept", "the best lambda so far")
    if m.get("diverged"):
        render.err_console.print(f"[yellow]warning:[/yellow] training diverged in {m['diverged']}; kept {kept}")
    elif "kept" in m:
        render.console.print(f"kept {kept}")
