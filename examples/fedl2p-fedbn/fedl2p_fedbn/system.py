"""FedBN as a fedl2p personalised-FL system: `fedl2p pfl-train --algo fedbn` trains it on a partition's seen
clients -> fedbn.safetensors; `fedl2p personalize --methods fedbn` evaluates every client with its own model.

What is stored: the shared (non-BN) weights under `shared.` and, under `local<c>.`, the BN layers of every client c
that trained at least once. A client the federation never trained (an unseen client, or a seen one that sampling
never picked) gets a model the paper does not define; here it starts from the shared weights and the trained
clients' mean BN layers, trains only its BN affine parameters on its own train split (the system's own
--local-epochs, --lr, --batch-size: what a FedBN client does in a round, restricted to what FedBN keeps local) and
estimates its BN statistics on that split. The shared weights stay as the federation trained them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedl2p_cli.api import (
    Artifact,
    ClientData,
    Draft,
    LocalConfig,
    LoopState,
    OnDevice,
    Partition,
    PFLConfig,
    PFLSystem,
    Timer,
    TrainedSystem,
    batch_stream,
    build_model,
    evaluate,
    generator,
    get_state,
    group_of,
    load_weights,
    nest,
    sample_clients,
    save_weights,
    to_device,
)

from . import fedbn

FILE = "fedbn.safetensors"


@dataclass
class FedBNTask:
    """A FedBN round's client: the server's shared weights and the client's own BN layers (None before its first
    round: it starts from the model's initial ones)."""
    client: int
    shared: dict
    local: dict | None
    round: int


@dataclass
class FedBNClient:
    """What a FedBN client update reads, built once per process (fedl2p places it on the runtime's device)."""
    model: torch.nn.Module
    part: Partition
    local_cfg: LocalConfig
    cfg: PFLConfig
    init_local: dict  # the model's initial BN layers: where a client's first round starts


def client_update(ctx: FedBNClient, task: FedBNTask) -> tuple[dict, int, float]:
    """One client's round: the whole model trained locally from the shared weights and its own BN layers."""
    x, y = ctx.part.client(task.client).train
    state, loss = fedbn.client_update(ctx.model, task.shared, task.local or ctx.init_local, x, y, ctx.cfg.lr,
                                      ctx.local_cfg, generator(ctx.cfg.seed, task.round, task.client))
    return state, len(y), loss


def validation(ctx: FedBNClient, arg: tuple[dict, int]) -> float:
    """Mean validation accuracy of the seen clients' FedBN models."""
    tensors, rnd = arg
    seen = ctx.part.pool(False)
    t = trained_of(tensors, sizes_of(ctx.part, seen))
    return float(np.nanmean([client_accuracy(ctx.model, t, c, ctx.part.client(c), ctx.part.client(c).val, ctx.cfg,
                                             generator(ctx.cfg.seed, rnd, c, 3)) for c in seen]))


class FedBNStrategy:
    """FedBN (Alg. 1): every sampled client trains the whole model locally; the server averages the non-BN weights
    and each client keeps its BN layers. The state: `shared.` plus `local<c>.` for every client that trained."""

    def __init__(self, cfg: PFLConfig, part: Partition, local: OnDevice):
        self.cfg, self.part, self.on = cfg, part, local
        self.label = f"pfl-train {cfg.algo}"
        model = build_model(cfg.model, part.in_channels, part.num_classes, cfg.seed)
        self.keys = fedbn.local_keys(model)
        self.init_shared, _ = fedbn.split(get_state(model), self.keys)
        self.seen = part.pool(False)

    def initial_state(self) -> LoopState:
        return LoopState(0, nest("shared", self.init_shared))

    def stop(self, st: LoopState) -> bool:
        return False

    def configure(self, st: LoopState, rnd: int, attempt: int = 0) -> list[FedBNTask]:
        shared = group_of(st.tensors, "shared")
        return [FedBNTask(c, shared, group_of(st.tensors, f"local{c}") or None, rnd)
                for c in sample_clients(self.seen, self.cfg.fraction, self.cfg.seed, rnd, attempt)]

    def aggregate(self, st: LoopState, rnd: int, tasks: list[FedBNTask], results: list, timer: Timer) -> dict:
        shared, locals_ = fedbn.aggregate([(r[0], r[1]) for r in results], self.keys)
        st.tensors = {k: v for k, v in st.tensors.items() if not k.startswith("shared.")} | nest("shared", shared)
        for t, loc in zip(tasks, locals_):
            st.tensors |= nest(f"local{t.client}", loc)
        rec = {"round": rnd + 1, "train_loss": float(np.mean([r[2] for r in results]))}
        if (rnd + 1) % self.cfg.eval_every == 0 or rnd + 1 == self.cfg.rounds:
            rec["val_acc"] = self.on(validation, (st.tensors, rnd))
        return rec

    def progress_info(self, rec: dict, st: LoopState) -> dict:
        return {"loss": rec["train_loss"], "acc": rec.get("val_acc")}


@dataclass
class Trained:
    """A trained FedBN: the shared weights, each trained client's BN layers, and their sample-weighted mean (where a
    client FedBN never trained starts)."""
    shared: dict
    locals: dict[int, dict]
    start: dict


def trained_of(tensors: dict, sizes: dict[int, int]) -> Trained:
    """The FedBN state in a flat state (a round's, or the artifact's); `sizes`: every client's train size."""
    locals_ = {c: loc for c in sizes if (loc := group_of(tensors, f"local{c}"))}
    start = fedbn.mean_local(list(locals_.values()), [sizes[c] for c in locals_])
    return Trained(group_of(tensors, "shared"), locals_, start)


def client_model(model: torch.nn.Module, t: Trained, c: int, data: ClientData, cfg: PFLConfig, gen: torch.Generator
                 ) -> dict:
    """Client c's FedBN model on its data's device: its own BN layers if it trained, else BN layers trained and
    estimated on its train split (module docstring)."""
    dev = data.train[0].device
    shared = to_device(t.shared, dev)
    if c in t.locals:
        return fedbn.state_of(shared, to_device(t.locals[c], dev))
    local_cfg = LocalConfig(epochs=cfg.local_epochs, batch_size=cfg.batch_size)
    local, _ = fedbn.adapt_bn(model, shared, to_device(t.start, dev), *data.train, cfg.lr, local_cfg, gen)
    return fedbn.state_of(shared, local)


def client_accuracy(model: torch.nn.Module, t: Trained, c: int, data: ClientData, split: tuple, cfg: PFLConfig,
                    gen: torch.Generator) -> float:
    """Accuracy on `split` (a split of `data`) of client c's FedBN model; NaN for an empty split."""
    if len(split[1]) == 0:
        return float("nan")
    state = client_model(model, t, c, data, cfg, gen)
    model.eval()
    return evaluate(model, state, *split)[1]


def sizes_of(part: Partition, clients: list[int]) -> dict[int, int]:
    return {c: part.client(c).n_train for c in clients}


class FedBN(PFLSystem):
    """FedBN as a fedl2p system: `context` and `client` run wherever fedl2p puts a round's clients (this process,
    `--workers` processes, Flower ClientApps); `strategy` is the server."""

    SETTINGS = {"fedbn": ("local_epochs",)}

    def context(self, cfg: PFLConfig, part: Partition) -> FedBNClient:
        model = build_model(cfg.model, part.in_channels, part.num_classes, cfg.seed)
        _, init_local = fedbn.split(get_state(model), fedbn.local_keys(model))
        return FedBNClient(model, part, LocalConfig(epochs=cfg.local_epochs, batch_size=cfg.batch_size), cfg, init_local)

    def strategy(self, cfg: PFLConfig, part: Partition, local: OnDevice) -> FedBNStrategy:
        return FedBNStrategy(cfg, part, local)

    client = staticmethod(client_update)

    def save(self, strategy: FedBNStrategy, state: LoopState, draft: Draft) -> dict:
        sizes = sizes_of(strategy.part, strategy.seen)
        save_weights(draft.path(FILE), state.tensors, {"algo": strategy.cfg.algo, "model": strategy.cfg.model,
                                                       "sizes": sizes})
        trained = trained_of(state.tensors, sizes)
        return {"algo": strategy.cfg.algo, "clients_trained": len(trained.locals), "local_tensors": len(strategy.keys)}

    def load(self, art: Artifact, cfg: PFLConfig, model: torch.nn.Module) -> Trained:
        tensors, meta = load_weights(art.file(FILE))
        return trained_of(tensors, {int(c): n for c, n in meta["sizes"].items()})

    def accuracy(self, t: TrainedSystem, c: int, data: ClientData, seed: int, steps: int) -> float:
        """Client c's test accuracy under FedBN; a client it never trained adapts its BN layers first, on the
        batches of personalisation seed `seed` (the same stream as the other methods')."""
        return client_accuracy(t.model, t.state, c, data, data.test, t.cfg, batch_stream(seed, c))
