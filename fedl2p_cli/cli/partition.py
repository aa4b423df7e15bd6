from __future__ import annotations

from pathlib import Path

import typer

from ..configs import PartitionConfig
from . import options, render
from .generate import config_command
from .options import StoreRuntime

stage = options.Lazy("fedl2p_cli.stages.partition")


@config_command(PartitionConfig)
def partition(
    cfg: PartitionConfig,
    rt: StoreRuntime,
    plot: bool = typer.Option(True, help="Write label_mix.png, a heatmap of the clients' label mixes."),
    force: bool = options.FORCE,
    store: Path | None = options.STORE,
) -> None:
    """Split a dataset into clients (Dirichlet label skew, feature-shift domains, seen/unseen pools) -> partition.h5."""
    art, reused = options.execute(stage, cfg, {}, store, rt, force, plot=plot)
    show(art.metrics)
    if art.metrics.get("source"):  # what loading did (image-folder: kept the images' size, or resized them)
        render.console.print(f"{cfg.dataset}: {art.metrics['source']}", highlight=False)
    render.artifact_line("partition", art.id, art.path, reused)


def show(m: dict) -> None:
    rows = [[d["domain"], d["seen"], d["unseen"], d["label_entropy"]] for d in m["domains"]]
    render.table(f"{m['clients']} clients, {m['samples']} samples; mean label entropy {m['mean_label_entropy']:.3f} "
                 f"(max {m['max_label_entropy']:.3f} nats)", ["domain", "seen", "unseen", "label entropy"], rows)
