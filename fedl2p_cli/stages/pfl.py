"""`fedl2p pfl-train`: the other personalised-FL systems, trained on a partition's seen clients.

pfedla / heurpfedla (Ma et al., CVPR 2022): the server's per-client models and hypernetworks -> clients.safetensors,
hypernets.safetensors. cafeme (Vettoruzzo et al., SDM 2024): omega = {modulator, base model} -> omega.safetensors.
`fedl2p personalize --methods pfedla,heurpfedla,cafeme` evaluates them beside FT and FedL2P on the same clients.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..algorithms import cafeme, pfedla
from ..algorithms.local import LocalConfig
from ..artifacts import Artifact, Draft, Store
from ..core.config import AT_LEAST_1, FRACTION, NON_NEGATIVE, POSITIVE, between, validate
from ..core.functional import evaluate, get_state
from ..core.layer_mix import layers_of
from ..core.modulate import gate_sites, init_modulator
from ..engine.loop import Checkpoint, LoopState, generator, sample_clients
from ..errors import FedL2PError
from ..io import weights
from ..io.partition_h5 import Partition
from ..models import registry
from . import partition as partition_stage
from .common import NoProgress, Progress, build_or_reuse, config_dict
from .pretrain import write_history

ALGOS = ("pfedla", "heurpfedla", "cafeme")
ORDERS, OUTERS = ("first", "second"), ("adam", "sgd")


@dataclass
class PFLConfig:
    algo: str = "pfedla"
    model: str = "small-cnn"
    rounds: int = field(default=100, metadata=AT_LEAST_1)
    fraction: float = field(default=1.0, metadata=FRACTION)    # pFedLA: all 10 clients; CAFeMe: M = 5 of 80
    batch_size: int = field(default=32, metadata=between(2))  # pFedLA 32; CAFeMe 30
    lr: float = field(default=0.005, metadata=POSITIVE)        # pFedLA local SGD LR (0.005 FMNIST); CAFeMe inner alpha
    local_epochs: int = field(default=10, metadata=AT_LEAST_1)  # pFedLA (10 clients: 10)
    hn_lr: float = field(default=5e-3, metadata=POSITIVE)     # pFedLA hypernetwork step
    embed_dim: int = field(default=100, metadata=AT_LEAST_1)
    hn_hidden: int = field(default=100, metadata=AT_LEAST_1)
    k: int = field(default=1, metadata=AT_LEAST_1)             # HeurpFedLA retained layers (paper: 1)
    steps: int = field(default=5, metadata=AT_LEAST_1)         # CAFeMe S
    outer_lr: float = field(default=1e-3, metadata=POSITIVE)  # CAFeMe beta
    order: str = "first"
    outer: str = "adam"
    eval_every: int = field(default=10, metadata=AT_LEAST_1)
    seed: int = field(default=0, metadata=NON_NEGATIVE)


def check(cfg: PFLConfig) -> None:
    validate(cfg)
    for opt, val, ok in (("--algo", cfg.algo, ALGOS), ("--order", cfg.order, ORDERS), ("--outer", cfg.outer, OUTERS)):
        if val not in ok:
            raise FedL2PError(f"unknown {opt} '{val}'; choose one of: {', '.join(ok)}")
    registry.spec(cfg.model)


def identity(cfg: PFLConfig) -> dict:
    """Only the settings the chosen algorithm reads are part of its artifact's id."""
    shared = ("algo", "model", "rounds", "fraction", "batch_size", "lr", "eval_every", "seed")
    own = {"pfedla": ("local_epochs", "hn_lr", "embed_dim", "hn_hidden"),
           "heurpfedla": ("local_epochs", "hn_lr", "embed_dim", "hn_hidden", "k"),
           "cafeme": ("steps", "outer_lr", "order", "outer")}[cfg.algo]
    d = config_dict(cfg)
    return {k: d[k] for k in (*shared, *own)}


def cafeme_config(cfg: PFLConfig, num_classes: int) -> cafeme.CAFeMeConfig:
    return cafeme.CAFeMeConfig(cfg.steps, cfg.lr, cfg.outer_lr, cfg.batch_size, cfg.order, cfg.outer, num_classes)


def train_pfedla(cfg: PFLConfig, part: Partition, ckpt: Checkpoint, progress: Progress) -> tuple[pfedla.Server, list[dict]]:
    model = registry.build(cfg.model, part.in_channels, part.num_classes, cfg.seed)
    seen = part.pool(False)
    names = [n for n, _ in model.named_parameters()]
    server = pfedla.init_server(seen, get_state(model), names, cfg.embed_dim, cfg.hn_hidden, generator(cfg.seed, 1))
    k = cfg.k if cfg.algo == "heurpfedla" else 0
    local = LocalConfig(cfg.local_epochs, cfg.batch_size)
    st = ckpt.load()
    if st:
        restore_server(server, st.tensors)
    st = st or LoopState(0, {})
    progress.start(f"pfl-train {cfg.algo}", cfg.rounds)
    progress.advance(st.next_round)
    for rnd in range(st.next_round, cfg.rounds):
        t0 = time.perf_counter()
        slots = [seen.index(c) for c in sample_clients(seen, cfg.fraction, cfg.seed, rnd)]
        results = {i: pfedla.client_round(model, server, i, part.client(seen[i]), local, cfg.lr, cfg.hn_lr, k,
                                          generator(cfg.seed, rnd, seen[i])) for i in slots}
        pfedla.apply_round(server, results)
        rec = {"round": rnd + 1, "train_loss": float(np.mean([r[2] for r in results.values()]))}
        if (rnd + 1) % cfg.eval_every == 0 or rnd + 1 == cfg.rounds:
            rec["val_acc"] = float(np.mean([pfedla_val(model, server, i, part.client(c).val, k) for i, c in enumerate(seen)]))
        st.history.append(rec | {"round_s": time.perf_counter() - t0})
        st.next_round, st.tensors = rnd + 1, server_tensors(server)
        ckpt.save(st)
        progress.advance(1, loss=rec["train_loss"], acc=rec.get("val_acc"))
    progress.stop()
    return server, st.history


def pfedla_val(model, server: pfedla.Server, i: int, val, k: int) -> float:
    if len(val[1]) == 0:
        return float("nan")
    bar, _ = pfedla.personalized(server, i, k)
    model.eval()
    return evaluate(model, bar, *val)[1]


def server_tensors(server: pfedla.Server) -> dict[str, torch.Tensor]:
    return {f"store.{k}": v for k, v in server.stacked.items()} | \
        {f"hn{i}.{k}": v for i, hn in enumerate(server.hypernets) for k, v in hn.items()}


def restore_server(server: pfedla.Server, tensors: dict[str, torch.Tensor]) -> None:
    server.stacked = {k[len("store."):]: v for k, v in tensors.items() if k.startswith("store.")}
    for i in range(len(server.hypernets)):
        p = f"hn{i}."
        server.hypernets[i] = {k[len(p):]: v for k, v in tensors.items() if k.startswith(p)}


def train_cafeme(cfg: PFLConfig, part: Partition, ckpt: Checkpoint, progress: Progress) -> tuple[dict, list[dict]]:
    model = registry.build(cfg.model, part.in_channels, part.num_classes, cfg.seed)
    sites = gate_sites(model, part.in_channels)
    ccfg = cafeme_config(cfg, part.num_classes)
    seen = part.pool(False)
    if any(len(part.client(c).val[1]) < 2 for c in seen):
        raise FedL2PError("cafeme needs a held-out split on every seen client; partition with --val-fraction > 0")
    mu = init_modulator(part.in_channels, part.num_classes, sum(c for _, c in sites), generator(cfg.seed, 2))
    omega0 = cafeme.join(mu, {n: p.detach().clone() for n, p in model.named_parameters()})
    st = ckpt.load() or LoopState(0, omega0)
    progress.start(f"pfl-train {cfg.algo}", cfg.rounds)
    progress.advance(st.next_round)
    for rnd in range(st.next_round, cfg.rounds):
        t0 = time.perf_counter()
        omega = {k: v for k, v in st.tensors.items() if not k.startswith("adam")}
        news, losses = [], []
        for c in sample_clients(seen, cfg.fraction, cfg.seed, rnd):
            p = f"adam{c}."
            moments = {k[len(p):]: v for k, v in st.tensors.items() if k.startswith(p)} or None
            t = int(st.extra.get("adam_t", {}).get(str(c), 0)) + 1
            new, l, moments = cafeme.client_update(model, sites, omega, part.client(c).train, part.client(c).val, ccfg,
                                                   generator(cfg.seed, rnd, c), moments, t)
            if not np.isfinite(l):
                raise FedL2PError(f"cafeme diverged in round {rnd + 1} (client {c}); lower --lr or --outer-lr")
            news.append(new)
            losses.append(l)
            if moments is not None:
                st.tensors |= {p + k: v for k, v in moments.items()}
                st.extra.setdefault("adam_t", {})[str(c)] = t
        omega = {k: torch.stack([n[k] for n in news]).mean(0) for k in omega}  # Alg. 1 line 11: plain mean
        st.tensors = {k: v for k, v in st.tensors.items() if k.startswith("adam")} | omega
        rec = {"round": rnd + 1, "held_out_loss": float(np.mean(losses))}
        if (rnd + 1) % cfg.eval_every == 0 or rnd + 1 == cfg.rounds:
            rec["val_acc"] = float(np.mean([cafeme.personalize_and_test(
                model, sites, omega, part.client(c).train, part.client(c).val, cfg.steps, ccfg, generator(cfg.seed, rnd, c, 3))
                for c in seen]))
        st.history.append(rec | {"round_s": time.perf_counter() - t0})
        st.next_round = rnd + 1
        ckpt.save(st)
        progress.advance(1, loss=rec["held_out_loss"], acc=rec.get("val_acc"))
    progress.stop()
    return {k: v for k, v in st.tensors.items() if not k.startswith("adam")}, st.history


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
            omega, history = train_cafeme(cfg, part, ckpt, progress or NoProgress())
            weights.save(draft.path("omega.safetensors"), omega, {"algo": cfg.algo, "model": cfg.model})
            draft.metrics = {"algo": cfg.algo, "params": int(sum(v.numel() for v in omega.values()))}
        else:
            server, history = train_pfedla(cfg, part, ckpt, progress or NoProgress())
            weights.save(draft.path("server.safetensors"), server_tensors(server),
                         {"algo": cfg.algo, "model": cfg.model, "clients": server.clients})
            draft.metrics = {"algo": cfg.algo, "server_state_bytes": server.nbytes()}
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
        k = t.cfg.k if t.algo == "heurpfedla" else 0
        bar, _ = pfedla.personalized(t.server, t.server.clients.index(c), k)
        t.model.eval()
        return evaluate(t.model, bar, *data.test)[1]
    ccfg = cafeme_config(t.cfg, t.num_classes)
    return cafeme.personalize_and_test(t.model, t.sites, t.omega, data.train, data.test, steps, ccfg, generator(seed, c, 7))

