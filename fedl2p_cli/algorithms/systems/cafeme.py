"""CAFeMe (Vettoruzzo et al., SDM 2024): omega = {modulator, base model} -> omega.safetensors; each client is
evaluated after `steps` steps of Alg. 2 on its train split."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...catalog import Catalog
from ...configs import PFLConfig
from ...core.client import Timer
from ...core.modulate import gate_sites, init_modulator
from ...engine.loop import LoopState, batch_stream, generator, group_of, nest, sample_clients
from ...engine.placement import OnDevice
from ...errors import FedL2PError
from ...io import weights
from ...io.partition_h5 import Partition
from ...models import registry
from .. import cafeme
from .base import PFLSystem

FILE = "omega.safetensors"


def cafeme_config(cfg: PFLConfig, num_classes: int) -> cafeme.CAFeMeConfig:
    return cafeme.CAFeMeConfig(steps=cfg.steps, inner_lr=cfg.lr, outer_lr=cfg.outer_lr, batch_size=cfg.batch_size,
                               order=cfg.order, outer=cfg.outer, num_classes=num_classes)


@dataclass
class CAFeMeTask:
    """A CAFeMe round's client: omega, its own Adam moments (None before its first round) and their step count."""
    client: int
    omega: dict
    moments: dict | None
    step: int
    round: int


@dataclass
class CAFeMeClient:
    """What a CAFeMe client update and the validation read (the executor places it on its device)."""
    model: torch.nn.Module
    sites: list
    part: Partition
    ccfg: cafeme.CAFeMeConfig
    seed: int


def client_of(cfg: PFLConfig, part: Partition, catalog: Catalog) -> CAFeMeClient:
    model = registry.build(cfg.model, part.in_channels, part.num_classes, cfg.seed, catalog=catalog)
    return CAFeMeClient(model, gate_sites(model, part.in_channels), part, cafeme_config(cfg, part.num_classes), cfg.seed)


def client_task(ctx: CAFeMeClient, task: CAFeMeTask):
    data = ctx.part.client(task.client)
    return cafeme.client_update(ctx.model, ctx.sites, task.omega, data.train, data.val, ctx.ccfg,
                                generator(ctx.seed, task.round, task.client), task.moments, task.step)


def validation(ctx: CAFeMeClient, task: tuple[dict, int, list[int], int]) -> float:
    """Mean validation accuracy of the seen clients, each personalising omega for `steps` steps first."""
    omega, rnd, seen, steps = task
    return float(np.mean([cafeme.personalize_and_test(
        ctx.model, ctx.sites, omega, ctx.part.client(c).train, ctx.part.client(c).val, steps, ctx.ccfg,
        generator(ctx.seed, rnd, c, 3)) for c in seen]))


class CAFeMeStrategy:
    """CAFeMe (Alg. 1): each sampled client personalises omega and takes one outer step; the server averages.
    The state is omega plus every client's Adam moments (keys adam<c>.). Clients and validation run where `local` is placed."""

    def __init__(self, cfg: PFLConfig, part: Partition, local: OnDevice, catalog: Catalog):
        self.cfg, self.part, self.on = cfg, part, local
        self.label = f"pfl-train {cfg.algo}"
        self.model = registry.build(cfg.model, part.in_channels, part.num_classes, cfg.seed, catalog=catalog)
        self.sites = gate_sites(self.model, part.in_channels)
        self.seen = part.pool(False)
        if any(len(part.client(c).val[1]) < 2 for c in self.seen):
            raise FedL2PError("cafeme needs a held-out split on every seen client; partition with --val-fraction > 0")

    def initial_state(self) -> LoopState:
        mu = init_modulator(self.part.in_channels, self.part.num_classes, sum(c for _, c in self.sites),
                            generator(self.cfg.seed, 2))
        psi = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        return LoopState(0, cafeme.join(mu, psi))

    def stop(self, st: LoopState) -> bool:
        return False

    def configure(self, st: LoopState, rnd: int, attempt: int = 0) -> list[CAFeMeTask]:
        omega = omega_of(st.tensors)
        return [CAFeMeTask(c, omega, group_of(st.tensors, f"adam{c}") or None,
                           int(st.extra.get("adam_t", {}).get(str(c), 0)) + 1, rnd)
                for c in sample_clients(self.seen, self.cfg.fraction, self.cfg.seed, rnd, attempt)]

    def aggregate(self, st: LoopState, rnd: int, tasks: list[CAFeMeTask], results: list, timer: Timer) -> dict:
        for task, (_, loss, moments) in zip(tasks, results):
            c, t = task.client, task.step
            if not np.isfinite(loss):
                raise FedL2PError(f"cafeme diverged in round {rnd + 1} (client {c}); lower --lr or --outer-lr")
            if moments is not None:
                st.tensors |= nest(f"adam{c}", moments)
                st.extra.setdefault("adam_t", {})[str(c)] = t
        omega = {k: torch.stack([r[0][k] for r in results]).mean(0) for k in tasks[0].omega}  # Alg. 1 line 11: plain mean
        st.tensors = {k: v for k, v in st.tensors.items() if k.startswith("adam")} | omega
        rec = {"round": rnd + 1, "held_out_loss": float(np.mean([r[1] for r in results]))}
        if (rnd + 1) % self.cfg.eval_every == 0 or rnd + 1 == self.cfg.rounds:
            rec["val_acc"] = self.on(validation, (omega, rnd, self.seen, self.cfg.steps))
        return rec

    def progress_info(self, rec: dict, st: LoopState) -> dict:
        return {"loss": rec["held_out_loss"], "acc": rec.get("val_acc")}


def omega_of(tensors: dict) -> dict:
    return {k: v for k, v in tensors.items() if not k.startswith("adam")}



@dataclass
class TrainedCAFeMe:
    """A trained CAFeMe: omega and the model's gate sites."""
    omega: dict
    sites: list



class CAFeMe(PFLSystem):
    """CAFeMe; the artifact holds omega, and each evaluated client personalises it for `steps` steps first."""

    SETTINGS = {"cafeme": ("steps", "outer_lr", "order", "outer")}

    def context(self, cfg: PFLConfig, part: Partition) -> CAFeMeClient:
        return client_of(cfg, part, self.catalog)

    def strategy(self, cfg: PFLConfig, part: Partition, local: OnDevice) -> CAFeMeStrategy:
        return CAFeMeStrategy(cfg, part, local, self.catalog)

    client = staticmethod(client_task)

    def save(self, strategy: CAFeMeStrategy, state: LoopState, draft) -> dict:
        omega = omega_of(state.tensors)
        weights.save(draft.path(FILE), omega, {"algo": strategy.cfg.algo, "model": strategy.cfg.model})
        return {"algo": strategy.cfg.algo, "params": int(sum(v.numel() for v in omega.values()))}

    def load(self, art, cfg: PFLConfig, model: torch.nn.Module) -> TrainedCAFeMe:
        return TrainedCAFeMe(weights.load(art.file(FILE)), gate_sites(model, art.config["in_channels"]))

    def accuracy(self, t, c: int, data, seed: int, steps: int) -> float:
        ccfg = cafeme_config(t.cfg, t.num_classes)
        return cafeme.personalize_and_test(t.model, t.state.sites, t.state.omega, data.train, data.test, steps, ccfg,
                                           batch_stream(seed, c))  # the stream every method of (c, seed) uses
