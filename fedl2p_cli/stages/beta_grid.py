"""`fedl2p analyze beta-grid`: fine-tune every seen client once per beta vector of a grid (each BN layer its own
level; PreciseBN client statistics, one LR for every tensor) and record validation and test accuracy, so that
choosing one vector for all clients, one per domain or one per client can be compared (analysis/beta_grid.py).
If "per domain" is not above "shared", a beta that differs by domain has nothing to gain on these clients, and
meta-nets that learn one beta for every domain give the right answer rather than failing to learn."""

from __future__ import annotations

import itertools
import json

import numpy as np
import torch

from ..analysis import beta_grid
from ..artifacts import Artifact, Draft
from ..configs import BetaGridConfig
from ..core.config import validate
from ..core.finetune import Strategy
from ..errors import FedL2PError
from .common import NoProgress, Progress, build_or_reuse, config_dict
from .harness import Harness
from .interface import Inputs, StageContext
from .rows import PARTITION, PRETRAIN, STATS

MAX_VECTORS = 4096


def vectors(cfg: BetaGridConfig, n_bn: int) -> list[tuple[float, ...]]:
    if len(cfg.levels) ** n_bn > MAX_VECTORS:
        raise FedL2PError(f"--levels gives {len(cfg.levels)}^{n_bn} = {len(cfg.levels) ** n_bn} beta vectors for this "
                          f"model's {n_bn} BN layers (at most {MAX_VECTORS}); use fewer levels")
    return list(itertools.product(cfg.levels, repeat=n_bn))


def scores(cfg: BetaGridConfig, h: Harness, clients: list[int], grid: list[tuple[float, ...]],
           progress: Progress) -> np.ndarray:
    """[seeds, clients, vectors, (val, test)] accuracy in percent; every vector of a client and seed sees the same
    batches (the harness's stream, as `personalize` draws them)."""
    out = np.zeros((len(cfg.seeds), len(clients), len(grid), 2))
    progress.start("beta grid", len(cfg.seeds) * len(clients))
    for k, seed in enumerate(cfg.seeds):
        for j, c in enumerate(clients):
            client = h.client(c)
            for i, vec in enumerate(grid):
                s = Strategy(torch.tensor(vec, dtype=torch.float32, device=h.dev), torch.full((h.n_params,), cfg.lr, device=h.dev))
                trial = h.finetune(client, s, seed)
                out[k, j, i] = [100 * trial.evaluate(split)[1] for split in ("val", "test")]
            progress.advance(1)
    progress.stop()
    return out


def execute(cfg: BetaGridConfig, inputs: Inputs, ctx: StageContext) -> tuple[Artifact, bool]:
    """The stage interface (`fedl2p analyze beta-grid`): the `stats` artifact among the inputs (its partition and
    pretrained model; default: the newest)."""
    validate(cfg)
    store, runtime, progress = ctx.store, ctx.runtime, ctx.progress
    if not cfg.levels or not cfg.seeds:
        raise FedL2PError("--levels and --seeds need at least one value each")
    stats_in = inputs.get(STATS)
    stats_art, table, part = stats_in.artifact, stats_in.value, stats_in.parent(PARTITION).value
    parents = {"stats": stats_art.id, "pretrain": stats_art.parents["pretrain"], "partition": stats_art.parents["partition"]}
    grid = vectors(cfg, table.xi.shape[1])
    clients = part.pool(False)
    if len(np.unique(part.domain[clients])) < 2:
        raise FedL2PError(f"the seen clients of partition {parents['partition']} come from one domain; a per-domain beta "
                          "needs two or more (e.g. --dataset fmnist-c)")

    def build(draft: Draft) -> None:
        model, state = stats_in.parent(PRETRAIN).value
        h = Harness.on(runtime.torch_device, model, state, part, table, cfg.epochs, cfg.batch_size)
        sc = scores(cfg, h, clients, grid, progress or NoProgress())
        domain = np.asarray(part.domain[clients])
        used = sorted(set(domain.tolist()))
        names = [part.domain_names[d] for d in used]
        summary = beta_grid.summarize(sc, np.searchsorted(used, domain), names, grid)
        draft.path("scores.json").write_text(json.dumps({"grid": grid, "clients": clients, "domain": [part.domain_names[d] for d in domain],
                                                         "seeds": cfg.seeds, "scores": sc.round(4).tolist()}))
        draft.path("summary.json").write_text(json.dumps(summary, indent=2))
        draft.path("summary.md").write_text(beta_grid.markdown(summary, cfg.lr, cfg.seeds, len(clients), len(grid)))
        c = summary["choices"]
        draft.metrics = {"shared": float(np.mean(c["shared"]["val"])), "per_domain": float(np.mean(c["per domain"]["val"])),
                         "per_domain_gain": float(np.mean(c["per domain"]["gain"])),
                         "per_domain_gain_sd": float(np.std(c["per domain"]["gain"]))}

    return build_or_reuse(store, "analyze", {"analysis": "beta-grid", **config_dict(cfg)}, parents, build, ctx.force,
                          runtime)
