"""`fedl2p pfl-train`: the other personalised-FL systems, trained on a partition's seen clients.

pfedla / heurpfedla (Ma et al., CVPR 2022): the server's per-client models and hypernetworks -> server.safetensors.
cafeme (Vettoruzzo et al., SDM 2024): omega = {modulator, base model} -> omega.safetensors.
`fedl2p personalize --methods pfedla,heurpfedla,cafeme` evaluates them beside FT and FedL2P on the same clients.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import device
from ..algorithms import cafeme, pfedla
from ..algorithms.local import LocalConfig
from ..artifacts import Artifact, Draft, Store
from .. import methods
from ..configs import PFLConfig
from ..core.config import validate
from ..core.functional import evaluate, get_state
from ..core.client import Timer
from ..core.layer_mix import layers_of
from ..core.modulate import gate_sites, init_modulator
from ..engine.loop import Checkpoint, LoopState, generator, group_of, nest, sample_clients
from ..engine.rounds import in_process, run_rounds
from ..errors import FedL2PError
from ..io import weights
from ..io.partition_h5 import Partition
from ..models import registry
from . import partition as partition_stage
from .common import NoProgress, Progress, build_or_reuse, config_dict
from .pretrain import write_history



def check(cfg: PFLConfig) -> None:
    validate(cfg)
    if cfg.algo not in methods.systems():  # the registered systems
        raise FedL2PError(f"unknown --algo '{cfg.algo}'; choose one of: {', '.join(methods.systems())}")
    registry.spec(cfg.model)


def identity(cfg: PFLConfig) -> dict:
    """Only the settings the chosen algorithm reads are part of its artifact's id."""
    shared = ("algo", "model", "rounds", "fraction", "batch_size", "lr", "eval_every", "seed")
    own = {"pfedla": ("local_epochs", "hn_lr", "embed_dim", "hn_hidden"),
           "heurpfedla": ("local_epochs", "hn_lr", "embed_dim", "hn_hidden", "k"),
           "cafeme": ("steps", "outer_lr", "order", "outer")}[cfg.algo]
    d = config_dict(cfg)
    return {k: d[k] for k in (*shared, *own)}


def retained_k(cfg: PFLConfig) -> int:
    """Layers kept local: HeurpFedLA's k, none for pFedLA."""
    return cfg.k if cfg.algo == "heurpfedla" else 0


def cafeme_config(cfg: PFLConfig, num_classes: int) -> cafeme.CAFeMeConfig:
    return cafeme.CAFeMeConfig(steps=cfg.steps, inner_lr=cfg.lr, outer_lr=cfg.outer_lr, batch_size=cfg.batch_size,
                               order=cfg.order, outer=cfg.outer, num_classes=num_classes)


@dataclass
class PFedLATask:
    """A pFedLA round's client: its id, its slot in the server's stacked models and hypernetworks, the round."""
    client: int
    slot: int
    round: int


@dataclass
class CAFeMeTask:
    """A CAFeMe round's client: omega, its own Adam moments (None before its first round) and their step count."""
    client: int
    omega: dict
    moments: dict | None
    step: int
    round: int


class PFedLAStrategy:
    """pFedLA / HeurpFedLA (Alg. 1-2): every sampled client trains its layer-wise mix; the server then updates the
    clients' hypernetworks and stored models (the state is the server: stacked models and hypernetworks)."""

    def __init__(self, cfg: PFLConfig, part: Partition):
        self.cfg, self.part = cfg, part
        self.label = f"pfl-train {cfg.algo}"
        self.model = registry.build(cfg.model, part.in_channels, part.num_classes, cfg.seed)
        self.dev = device.current()
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


class CAFeMeStrategy:
    """CAFeMe (Alg. 1): each sampled client personalises omega and takes one outer step; the server averages.
    The state is omega plus every client's Adam moments (keys adam<c>.)."""

    def __init__(self, cfg: PFLConfig, part: Partition):
        self.cfg, self.part = cfg, part
        self.label = f"pfl-train {cfg.algo}"
        self.model = registry.build(cfg.model, part.in_channels, part.num_classes, cfg.seed)
        self.sites = gate_sites(self.model, part.in_channels)
        self.ccfg = cafeme_config(cfg, part.num_classes)
        self.seen = part.pool(False)
        self.dev = device.current()
        self.model.to(self.dev)
        self.omega_cache = device.RoundCache()
        if any(len(part.client(c).val[1]) < 2 for c in self.seen):
            raise FedL2PError("cafeme needs a held-out split on every seen client; partition with --val-fraction > 0")

    def initial_state(self) -> LoopState:
        mu = init_modulator(self.part.in_channels, self.part.num_classes, sum(c for _, c in self.sites),
                            generator(self.cfg.seed, 2))
        psi = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        return LoopState(0, cafeme.join(mu, device.to_host(psi)))

    def stop(self, st: LoopState) -> bool:
        return False

    def configure(self, st: LoopState, rnd: int) -> list[CAFeMeTask]:
        omega = omega_of(st.tensors)
        return [CAFeMeTask(c, omega, group_of(st.tensors, f"adam{c}") or None,
                           int(st.extra.get("adam_t", {}).get(str(c), 0)) + 1, rnd)
                for c in sample_clients(self.seen, self.cfg.fraction, self.cfg.seed, rnd)]

    def client(self, task: CAFeMeTask):
        data = self.part.client_on(task.client, self.dev)
        r = cafeme.client_update(self.model, self.sites, self.omega_cache.get(task.omega, self.dev), data.train, data.val,
                                 self.ccfg, generator(self.cfg.seed, task.round, task.client),
                                 device.move(task.moments, self.dev), task.step)
        return device.to_host(r)

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
            on = device.move(omega, self.dev)
            rec["val_acc"] = float(np.mean([cafeme.personalize_and_test(
                self.model, self.sites, on, self.part.client_on(c, self.dev).train, self.part.client_on(c, self.dev).val,
                self.cfg.steps, self.ccfg, generator(self.cfg.seed, rnd, c, 3)) for c in self.seen]))
        return rec

    def progress_info(self, rec: dict, st: LoopState) -> dict:
        return {"loss": rec["held_out_loss"], "acc": rec.get("val_acc")}


def omega_of(tensors: dict) -> dict:
    return {k: v for k, v in tensors.items() if not k.startswith("adam")}


def run(cfg: PFLConfig, store: Store, partition_ref: str | None = None, force: bool = False, resume: bool = True,
        progress: Progress | None = None) -> tuple[Artifact, bool]:
    check(cfg)
    part_art, part = partition_stage.load(store, partition_ref)
    conf = identity(cfg) | {"in_channels": part.in_channels, "num_classes": part.num_classes}

    def build(draft: Draft) -> None:
        ckpt = Checkpoint(store.workdir("pfl", draft.id))
        if not resume:
            ckpt.clear()
        if cfg.algo == "cafeme":
            strategy = CAFeMeStrategy(cfg, part)
            st = run_rounds(strategy, cfg.rounds, ckpt, progress or NoProgress(), in_process(strategy.client))
            omega, history = omega_of(st.tensors), st.history
            weights.save(draft.path("omega.safetensors"), omega, {"algo": cfg.algo, "model": cfg.model})
            draft.metrics = {"algo": cfg.algo, "params": int(sum(v.numel() for v in omega.values()))}
        else:
            strategy = PFedLAStrategy(cfg, part)
            st = run_rounds(strategy, cfg.rounds, ckpt, progress or NoProgress(), in_process(strategy.client))
            restore_server(strategy.server, st.tensors)  # st.tensors is the server state, flat
            history = st.history
            weights.save(draft.path("server.safetensors"), st.tensors,
                         {"algo": cfg.algo, "model": cfg.model, "clients": strategy.server.clients})
            draft.metrics = {"algo": cfg.algo, "server_state_bytes": strategy.server.nbytes()}
        write_history(draft.path("history.csv"), history)
        draft.metrics |= {k: v for k, v in history[-1].items() if k in ("val_acc", "train_loss", "held_out_loss")}

    return build_or_reuse(store, "pfl", conf, {"partition": part_art.id}, build, force)


@dataclass
class Trained:
    """A loaded pfl artifact, ready to evaluate clients: pFedLA's per-client models or CAFeMe's omega."""

    algo: str
    art_id: str
    model: torch.nn.Module
    cfg: PFLConfig
    num_classes: int
    server: pfedla.Server | None = None
    omega: dict | None = None
    sites: list | None = None


def to_device(t: Trained, dev: torch.device) -> Trained:
    """A trained system with its model and tensors on `dev` (a CPU one is returned as it is)."""
    if dev.type == "cpu":
        return t
    t.model.to(dev)
    return device.move(t, dev)


def load(store: Store, ref: str | None) -> Trained:
    art = store.load("pfl", ref)
    c = art.config
    cfg = PFLConfig(**{k: v for k, v in c.items() if k in PFLConfig.__dataclass_fields__})
    model = registry.build(c["model"], c["in_channels"], c["num_classes"], c["seed"])
    if cfg.algo == "cafeme":
        omega = weights.load(art.file("omega.safetensors"))
        return Trained(cfg.algo, art.id, model, cfg, c["num_classes"], omega=omega, sites=gate_sites(model, c["in_channels"]))
    tensors, meta = weights.load_with_meta(art.file("server.safetensors"))
    names = [n for n, _ in model.named_parameters()]
    server = pfedla.Server(meta["clients"], {}, [{} for _ in meta["clients"]], names, layers_of(names))
    restore_server(server, tensors)
    return Trained(cfg.algo, art.id, model, cfg, c["num_classes"], server=server)


def client_accuracy(t: Trained, c: int, data, seed: int, steps: int) -> float:
    """Test accuracy of client c under a trained system: pFedLA's personalised model theta_bar_c (NaN for a client
    it never trained: it has no hypernetwork); CAFeMe after `steps` steps of Alg. 2 on the client's train split."""
    if t.server is not None:
        if c not in t.server.clients:
            return float("nan")
        return pfedla_val(t.model, t.server, t.server.clients.index(c), data.test, retained_k(t.cfg))
    ccfg = cafeme_config(t.cfg, t.num_classes)
    return cafeme.personalize_and_test(t.model, t.sites, t.omega, data.train, data.test, steps, ccfg, generator(seed, c, 7))

