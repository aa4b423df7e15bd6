"""pFedLA / HeurpFedLA (Ma et al., CVPR 2022): the server's per-client models and hypernetworks ->
server.safetensors; each trained client is evaluated with its personalised model theta_bar_c (Alg. 1's output)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ... import device
from ...algorithms import pfedla
from ...algorithms.local import LocalConfig
from ...configs import PFLConfig
from ...core.client import Timer
from ...core.functional import evaluate, get_state
from ...core.layer_mix import layers_of
from ...engine.loop import LoopState, generator, group_of, nest, sample_clients
from ...engine.rounds import in_process, run_rounds
from ...io import weights
from ...io.partition_h5 import Partition
from ...models import registry
from ...runtime import Runtime

SETTINGS = {"pfedla": ("local_epochs", "hn_lr", "embed_dim", "hn_hidden"),
            "heurpfedla": ("local_epochs", "hn_lr", "embed_dim", "hn_hidden", "k")}


def retained_k(cfg: PFLConfig) -> int:
    """Layers kept local: HeurpFedLA's k, none for pFedLA."""
    return cfg.k if cfg.algo == "heurpfedla" else 0


@dataclass
class PFedLATask:
    """A pFedLA round's client: its id, its slot in the server's stacked models and hypernetworks, the round."""
    client: int
    slot: int
    round: int


class PFedLAStrategy:
    """pFedLA / HeurpFedLA (Alg. 1-2): every sampled client trains its layer-wise mix; the server then updates the
    clients' hypernetworks and stored models (the state is the server: stacked models and hypernetworks)."""

    def __init__(self, cfg: PFLConfig, part: Partition, dev: torch.device = torch.device("cpu")):
        self.cfg, self.part = cfg, part
        self.label = f"pfl-train {cfg.algo}"
        self.model = registry.build(cfg.model, part.in_channels, part.num_classes, cfg.seed)
        self.dev = dev
        self.seen = part.pool(False)
        names = [n for n, _ in self.model.named_parameters()]
        self.server = pfedla.init_server(self.seen, get_state(self.model), names, cfg.embed_dim, cfg.hn_hidden,
                                         generator(cfg.seed, 1))
        self.k = retained_k(cfg)
        self.local = LocalConfig(epochs=cfg.local_epochs, batch_size=cfg.batch_size)
        self.model.to(self.dev)  # the server's tensors follow in configure (the state itself stays on the CPU)

    def initial_state(self) -> LoopState:
        return LoopState(0, server_tensors(self.server))

    def stop(self, st: LoopState) -> bool:
        return False

    def configure(self, st: LoopState, rnd: int) -> list[PFedLATask]:
        restore_server(self.server, device.move(st.tensors, self.dev))
        return [PFedLATask(c, self.seen.index(c), rnd) for c in sample_clients(self.seen, self.cfg.fraction, self.cfg.seed, rnd)]

    def client(self, task: PFedLATask):
        return pfedla.client_round(self.model, self.server, task.slot, self.part.client_on(task.client, self.dev), self.local,
                                   self.cfg.lr, self.cfg.hn_lr, self.k, generator(self.cfg.seed, task.round, task.client))

    def aggregate(self, st: LoopState, rnd: int, tasks: list[PFedLATask], results: list, timer: Timer) -> dict:
        pfedla.apply_round(self.server, {t.slot: r for t, r in zip(tasks, results)})
        st.tensors = device.to_host(server_tensors(self.server))
        rec = {"round": rnd + 1, "train_loss": float(np.mean([r[2] for r in results]))}
        if (rnd + 1) % self.cfg.eval_every == 0 or rnd + 1 == self.cfg.rounds:
            rec["val_acc"] = float(np.mean([pfedla_val(self.model, self.server, i, self.part.client_on(c, self.dev).val, self.k)
                                            for i, c in enumerate(self.seen)]))
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




def train(cfg: PFLConfig, part: Partition, ckpt, progress, draft, runtime: Runtime = Runtime()
          ) -> tuple[list[dict], dict]:
    strategy = PFedLAStrategy(cfg, part, runtime.torch_device)
    st = run_rounds(strategy, cfg.rounds, ckpt, progress, in_process(strategy.client))
    restore_server(strategy.server, st.tensors)  # st.tensors is the server state, flat
    weights.save(draft.path("server.safetensors"), st.tensors,
                 {"algo": cfg.algo, "model": cfg.model, "clients": strategy.server.clients})
    return st.history, {"algo": cfg.algo, "server_state_bytes": strategy.server.nbytes()}


def load(art, cfg: PFLConfig, model: torch.nn.Module) -> pfedla.Server:
    tensors, meta = weights.load_with_meta(art.file("server.safetensors"))
    names = [n for n, _ in model.named_parameters()]
    server = pfedla.Server(meta["clients"], {}, [{} for _ in meta["clients"]], names, layers_of(names))
    restore_server(server, tensors)
    return server


def accuracy(t, c: int, data, seed: int, steps: int) -> float:
    """Client c's personalised model theta_bar_c on its test split; NaN for a client it never trained (it has no
    hypernetwork)."""
    server = t.state
    if c not in server.clients:
        return float("nan")
    return pfedla_val(t.model, server, server.clients.index(c), data.test, retained_k(t.cfg))
