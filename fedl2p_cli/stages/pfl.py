"""`fedl2p pfl-train`: the other personalised-FL systems, trained on a partition's seen clients. Each registered
system (fedl2p_cli/methods: `System.trainer`) has its own module under stages/systems/ (`train(cfg, part, ckpt,
progress, draft, runtime)`, `load`, `accuracy`, `SETTINGS`):
pfedla / heurpfedla (Ma et al., CVPR 2022): the server's per-client models and hypernetworks -> server.safetensors.
cafeme (Vettoruzzo et al., SDM 2024): omega = {modulator, base model} -> omega.safetensors.
`fedl2p personalize --methods pfedla,heurpfedla,cafeme` evaluates them beside FT and FedL2P on the same clients.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch

from .. import plugins
from ..artifacts import Artifact, Draft, Store
from ..configs import PFLConfig
from ..core.config import validate
from ..engine.loop import Checkpoint
from ..models import guard, registry
from ..runtime import Runtime
from . import partition as partition_stage
from .common import NoProgress, Progress, build_or_reuse, config_dict
from .pretrain import write_history


def check(cfg: PFLConfig) -> None:
    validate(cfg)
    plugins.current().get("system", cfg.algo)  # a registered system
    registry.spec(cfg.model)


def trainer(algo: str):
    """The module that trains and evaluates a registered system (methods.System.trainer)."""
    return importlib.import_module(plugins.current().get("system", algo).trainer)


def identity(cfg: PFLConfig) -> dict:
    """Only the settings the chosen system reads are part of its artifact's id."""
    shared = ("algo", "model", "rounds", "fraction", "batch_size", "lr", "eval_every", "seed")
    d = config_dict(cfg)
    return {k: d[k] for k in (*shared, *trainer(cfg.algo).SETTINGS[cfg.algo])}


def run(cfg: PFLConfig, store: Store, partition_ref: str | None = None, force: bool = False, resume: bool = True,
        progress: Progress | None = None, runtime: Runtime | None = None) -> tuple[Artifact, bool]:
    if ":" in cfg.model:  # named by the user
        guard.allow(cfg.model)
    check(cfg)
    runtime = runtime or Runtime()
    part_art, part = partition_stage.load(store, partition_ref)
    conf = identity(cfg) | {"in_channels": part.in_channels, "num_classes": part.num_classes}

    def build(draft: Draft) -> None:
        ckpt = Checkpoint(store.workdir("pfl", draft.id))
        if not resume:
            ckpt.clear()
        history, draft.metrics = trainer(cfg.algo).train(cfg, part, ckpt, progress or NoProgress(), draft,
                                                          runtime)
        write_history(draft.path("history.csv"), history)
        draft.metrics |= {k: v for k, v in history[-1].items() if k in ("val_acc", "train_loss", "held_out_loss")}

    return build_or_reuse(store, "pfl", conf, {"partition": part_art.id}, build, force, runtime)


@dataclass
class Trained:
    """A loaded pfl artifact, ready to evaluate clients: its model and the system's own trained state."""

    algo: str
    art_id: str
    model: torch.nn.Module
    cfg: PFLConfig
    num_classes: int
    state: Any


def load(store: Store, ref: str | None) -> Trained:
    art = store.load("pfl", ref)
    c = art.config
    cfg = PFLConfig(**{k: v for k, v in c.items() if k in PFLConfig.__dataclass_fields__})
    guard.from_artifact(art, c["model"])
    model = registry.build(c["model"], c["in_channels"], c["num_classes"], c["seed"])
    return Trained(cfg.algo, art.id, model, cfg, c["num_classes"], trainer(cfg.algo).load(art, cfg, model))


def client_accuracy(t: Trained, c: int, data, seed: int, steps: int) -> float:
    """Test accuracy of client c under a trained system (NaN where the system has no model for it)."""
    return trainer(t.algo).accuracy(t, c, data, seed, steps)
