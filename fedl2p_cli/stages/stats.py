"""`fedl2p stats`: per-client layer statistics and KL distances (the meta-nets' inputs) -> stats.h5."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..artifacts import Artifact, Draft, Store
from ..catalog import Catalog
from ..configs import StatsConfig
from ..core.bn import bn_layers
from ..core.config import validate
from ..core.stats import many_client_stats, stat_layers
from ..engine.placement import OnDevice
from ..errors import ArtifactError
from ..io import stats_h5
from ..io.partition_h5 import Partition
from ..models.registry import param_names
from .common import NoProgress, Progress, build_or_reuse, config_dict
from .interface import Inputs, StageContext
from .rows import PARTITION, PRETRAIN


@dataclass
class Forward:
    """What the statistics read: the pretrained model and the clients (placed on the device by the executor)."""
    model: torch.nn.Module
    part: Partition


def chunk_stats(ctx: Forward, task: tuple[list[int], int]) -> list:
    chunk, batch_size = task
    return many_client_stats(ctx.model, [ctx.part.client(c).train[0] for c in chunk], batch_size)


def compute(model: torch.nn.Module, part, clients: list[int], batch_size: int, progress: Progress,
            dev: torch.device) -> dict:
    """Every client's statistics (its train split only), computed on `dev` and gathered on the CPU."""
    on, rows = OnDevice(Forward(model, part), dev), []
    progress.start("client statistics", len(clients))
    for s in range(0, len(clients), 64):  # chunks, so the bar moves; equal-sized clients share forward passes
        chunk = clients[s:s + 64]
        rows += on(chunk_stats, (chunk, batch_size))
        progress.advance(len(chunk))
    progress.stop()
    return {"x": torch.stack([r.x for r in rows]), "xi": torch.stack([r.xi for r in rows]),
            "bn_mean": [torch.stack([r.bn_mean[b] for r in rows]) for b in range(len(rows[0].bn_mean))],
            "bn_var": [torch.stack([r.bn_var[b] for r in rows]) for b in range(len(rows[0].bn_var))]}


def summary(t: stats_h5.StatsTable, domain_names: list[str]) -> dict:
    """Mean xi per domain and BN layer: which domains shift which layers."""
    per = {}
    for d, name in enumerate(domain_names):
        m = t.domain == d
        if m.any():
            per[name] = [float(v) for v in t.xi[torch.from_numpy(m)].mean(0)]
    return {"clients": len(t.client), "bn_layers": t.bn_names, "mean_xi_per_domain": per}


def execute(cfg: StatsConfig, inputs: Inputs, ctx: StageContext) -> tuple[Artifact, bool]:
    """The stage interface: the `pretrain`ed model and the clients' `partition` among the inputs (defaults: the
    newest model, and the partition it was pretrained on)."""
    validate(cfg)
    store, runtime, progress = ctx.store, ctx.runtime, ctx.progress
    pre = inputs.get(PRETRAIN)
    part_in = inputs.get(PARTITION, pre.artifact.parents["partition"])
    pre_art, part_art = pre.artifact, part_in.artifact
    # a model pretrained on another partition is allowed (the paper personalises CIFAR-10-C from the alpha=1000 model)
    parents = {"partition": part_art.id, "pretrain": pre_art.id}

    def build(draft: Draft) -> None:
        part, model = part_in.value, pre.value.model
        check_fit(model, part)
        clients = list(range(part.num_clients))
        cols = compute(model, part, clients, cfg.batch_size, progress or NoProgress(), runtime.torch_device)
        bns = [m for _, m in bn_layers(model)]
        table = stats_h5.StatsTable(
            pre_art.config["model"], [n for n, _ in stat_layers(model)], [n for n, _ in bn_layers(model)], param_names(model),
            np.array(clients), part.domain, part.unseen, cols["x"], cols["xi"], cols["bn_mean"], cols["bn_var"],
            [b.running_mean.clone() for b in bns], [b.running_var.clone() for b in bns], parents)
        stats_h5.write(draft.path("stats.h5"), table)
        draft.metrics = summary(table, part.domain_names)

    return build_or_reuse(store, "stats", config_dict(cfg, exclude=("batch_size",)), parents, build, ctx.force, runtime)


def check_fit(model: torch.nn.Module, part) -> None:
    x = part.client(0).train[0][:2]
    try:
        with torch.no_grad():
            out = model.eval()(x)
    except RuntimeError:
        raise ArtifactError(f"the pretrained model does not accept this partition's {tuple(x.shape[1:])} images") from None
    if out.shape[1] != part.num_classes:
        raise ArtifactError(f"the pretrained model has {out.shape[1]} classes, the partition {part.num_classes}")


def read(art: Artifact, catalog: Catalog | None = None) -> stats_h5.StatsTable:
    """The stage's reader (its row's `reader`): the statistics table an artifact holds (a file: no catalog needed)."""
    return stats_h5.read(art.file("stats.h5"))


def load(store: Store, ref: str | None) -> tuple[Artifact, stats_h5.StatsTable]:
    """A stats artifact (its newest for None) and its table: for code outside the stages (tests, benches)."""
    art = store.load("stats", ref)
    return art, read(art)


