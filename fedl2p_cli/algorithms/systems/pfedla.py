"""pFedLA / HeurpFedLA (Ma et al., CVPR 2022): the server's per-client models and hypernetworks ->
server.safetensors; each trained client is evaluated with its personalised model theta_bar_c (Alg. 1's output)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from ...catalog import Catalog
from ...configs import PFLConfig
from ...core.client import Timer
from ...core.functional import evaluate, get_state
from ...core.layer_mix import layers_of
from ...engine.loop import LoopState, generator, group_of, nest, sample_clients
from ...engine.placement import OnDevice
from ...io import weights
from ...io.partition_h5 import Partition
from ...models import registry
from .. import pfedla
from ..local import LocalConfig
from .base import PFLSystem

FILE = "server.safetensors"


def retained_k(cfg: PFLConfig) -> int:
    """Layers kept local: HeurpFedLA's k, none for pFedLA."""
    return cfg.k if cfg.algo == "heurpfedla" else 0


@dataclass
class PFedLATask:
    """A pFedLA round's client: its id, its slot in the server's stacked models and hypernetworks, the round, and the
    server's state (flat, `server_tensors`) that the round's clients share."""
    client: int
    slot: int
    round: int
    server: dict


@dataclass
class PFedLAClient:
    """What a pFedLA client update, the server's round and the validation read (the executor places it on its
    device); `server` holds the clients and layer names, its tensors come with each task."""
    model: torch.nn.Module
    part: Partition
    local: LocalConfig
    lr: float
    hn_lr: float
    k: int
    seed: int
    server: pfedla.Server


def client_of(cfg: PFLConfig, part: Partition, catalog: Catalog) -> PFedLAClient:
    """A client's context; its server holds only the shape (clients, layer names): the tensors come with each task."""
    model = registry.build(cfg.model, part.in_channels, part.num_classes, cfg.seed, catalog=catalog)
    names = [n for n, _ in model.named_parameters()]
    seen = part.pool(False)
    shape = pfedla.Server(seen, {}, [{} for _ in seen], names, layers_of(names))
    return PFedLAClient(model, part, LocalConfig(epochs=cfg.local_epochs, batch_size=cfg.batch_size), cfg.lr, cfg.hn_lr,
                        retained_k(cfg), cfg.seed, shape)


def server_of(ctx: PFedLAClient, tensors: dict) -> pfedla.Server:
    server = replace(ctx.server, hypernets=list(ctx.server.hypernets))
    restore_server(server, tensors)
    return server


def client_task(ctx: PFedLAClient, task: PFedLATask):
    return pfedla.client_round(ctx.model, server_of(ctx, task.server), task.slot, ctx.part.client(task.client), ctx.local,
                               ctx.lr, ctx.hn_lr, ctx.k, generator(ctx.seed, task.round, task.client))


def client_tasks(ctx: PFedLAClient, tasks: list[PFedLATask]) -> list:
    """Several clients' rounds as one computation (`--engine batched`): their local SGD vmapped, per client what
    `client_task` computes to float rounding. The round's tasks share one server state (one dict, sent once)."""
    out: list = []
    for shared in _by_server(tasks):
        server = server_of(ctx, shared[0].server)
        out += pfedla.client_rounds(ctx.model, server, [t.slot for t in shared], [ctx.part.client(t.client) for t in shared],
                                    ctx.local, ctx.lr, ctx.hn_lr, ctx.k,
                                    [generator(ctx.seed, t.round, t.client) for t in shared])
    return out


def _by_server(tasks: list[PFedLATask]) -> list[list[PFedLATask]]:
    """Consecutive tasks that carry the same server dict, in order."""
    runs: list[list[PFedLATask]] = []
    for t in tasks:
        if runs and runs[-1][0].server is t.server:
            runs[-1].append(t)
        else:
            runs.append([t])
    return runs


def server_round(ctx: PFedLAClient, task: tuple[dict, dict]) -> dict:
    """The server's update of the clients' hypernetworks and stored models from the round's results (slot -> result)."""
    tensors, results = task
    server = server_of(ctx, tensors)
    pfedla.apply_round(server, results)
    return server_tensors(server)


def validation(ctx: PFedLAClient, tensors: dict) -> float:
    """Mean accuracy of every trained client's personalised model on its validation split."""
    server = server_of(ctx, tensors)
    return float(np.mean([pfedla_val(ctx.model, server, i, ctx.part.client(c).val, ctx.k)
                          for i, c in enumerate(server.clients)]))


class PFedLAStrategy:
    """pFedLA / HeurpFedLA (Alg. 1-2): every sampled client trains its layer-wise mix; the server then updates the
    clients' hypernetworks and stored models (the state is the server: stacked models and hypernetworks). Clients,
    the server's round and the validation run where `local` is placed."""

    def __init__(self, cfg: PFLConfig, part: Partition, local: OnDevice, catalog: Catalog):
        self.cfg, self.part, self.on = cfg, part, local
        self.label = f"pfl-train {cfg.algo}"
        self.model = registry.build(cfg.model, part.in_channels, part.num_classes, cfg.seed, catalog=catalog)
        self.seen = part.pool(False)
        names = [n for n, _ in self.model.named_parameters()]
        self.server = pfedla.init_server(self.seen, get_state(self.model), names, cfg.embed_dim, cfg.hn_hidden,
                                         generator(cfg.seed, 1))

    def initial_state(self) -> LoopState:
        return LoopState(0, server_tensors(self.server))

    def stop(self, st: LoopState) -> bool:
        return False

    def configure(self, st: LoopState, rnd: int, attempt: int = 0) -> list[PFedLATask]:
        return [PFedLATask(c, self.seen.index(c), rnd, st.tensors)
                for c in sample_clients(self.seen, self.cfg.fraction, self.cfg.seed, rnd, attempt)]

    def aggregate(self, st: LoopState, rnd: int, tasks: list[PFedLATask], results: list, timer: Timer) -> dict:
        st.tensors = self.on(server_round, (st.tensors, {t.slot: r for t, r in zip(tasks, results)}))
        rec = {"round": rnd + 1, "train_loss": float(np.mean([r[2] for r in results]))}
        if (rnd + 1) % self.cfg.eval_every == 0 or rnd + 1 == self.cfg.rounds:
            rec["val_acc"] = self.on(validation, st.tensors)
        return rec

    def progress_info(self, rec: dict, st: LoopState) -> dict:
        return {"loss": rec["train_loss"], "acc": rec.get("val_acc")}


def pfedla_val(model, server: pfedla.Server, i: int, val, k: int) -> float:
    """Accuracy of client slot i's personalised model theta_bar_i (Alg. 1's output) on `val` (a split)."""
    if len(val[1]) == 0:
        return float("nan")
    bar, _ = pfedla.personalized(server, i, k)
    model.eval()
    return evaluate(model, bar, *val)[1]


def server_tensors(server: pfedla.Server) -> dict[str, torch.Tensor]:
    out = nest("store", server.stacked)
    for i, hn in enumerate(server.hypernets):
        out |= nest(f"hn{i}", hn)
    return out


def restore_server(server: pfedla.Server, tensors: dict[str, torch.Tensor]) -> None:
    server.stacked = group_of(tensors, "store")
    server.hypernets = [group_of(tensors, f"hn{i}") for i in range(len(server.hypernets))]



class PFedLA(PFLSystem):
    """pFedLA and HeurpFedLA (HeurpFedLA keeps its first k layers local); the artifact holds the server."""

    SETTINGS = {"pfedla": ("local_epochs", "hn_lr", "embed_dim", "hn_hidden"),
                "heurpfedla": ("local_epochs", "hn_lr", "embed_dim", "hn_hidden", "k")}

    def context(self, cfg: PFLConfig, part: Partition) -> PFedLAClient:
        return client_of(cfg, part, self.catalog)

    def strategy(self, cfg: PFLConfig, part: Partition, local: OnDevice) -> PFedLAStrategy:
        return PFedLAStrategy(cfg, part, local, self.catalog)

    client = staticmethod(client_task)
    client_many = staticmethod(client_tasks)

    def save(self, strategy: PFedLAStrategy, state: LoopState, draft) -> dict:
        restore_server(strategy.server, state.tensors)  # the state is the server, flat
        weights.save(draft.path(FILE), state.tensors,
                     {"algo": strategy.cfg.algo, "model": strategy.cfg.model, "clients": strategy.server.clients})
        return {"algo": strategy.cfg.algo, "server_state_bytes": strategy.server.nbytes()}

    def load(self, art, cfg: PFLConfig, model: torch.nn.Module) -> pfedla.Server:
        tensors, meta = weights.load_with_meta(art.file(FILE))
        names = [n for n, _ in model.named_parameters()]
        server = pfedla.Server(meta["clients"], {}, [{} for _ in meta["clients"]], names, layers_of(names))
        restore_server(server, tensors)
        return server

    def accuracy(self, t, c: int, data, seed: int, steps: int) -> float:
        """Client c's personalised model theta_bar_c on its test split; NaN for a client it never trained (it has
        no hypernetwork)."""
        server = t.state
        if c not in server.clients:
            return float("nan")
        return pfedla_val(t.model, server, server.clients.index(c), data.test, retained_k(t.cfg))
