"""Client-side pretraining updates. Each is a pure function of (state, data, lr, generator):
the nn.Module passed in is only a reusable workspace, built once per run."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.bn import bn_layers
from ..core.client import LocalConfig
from ..core.finetune import ClientBN
from ..core.functional import epochs_of_batches, get_state, mean_loss, random_batch, set_state

State = dict[str, Tensor]


def sgd_client(model: nn.Module, state: State, x: Tensor, y: Tensor, lr: float, cfg: LocalConfig,
               gen: torch.Generator) -> tuple[State, float]:
    """FedAvg / FedBABU local update: plain SGD for `epochs` epochs; FedBABU keeps the head fixed (lr 0)."""
    set_state(model, state).train()
    params = [p for n, p in model.named_parameters() if not (cfg.freeze_head and n.startswith(cfg.head))]
    losses = []
    for idx in epochs_of_batches(len(y), cfg.batch_size, gen, cfg.epochs, x.device):
        loss = F.cross_entropy(model(x[idx]), y[idx])
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(lr * g)
        losses.append(loss.detach())  # on the device: no host sync per step
    return get_state(model), mean_loss(losses)


def sgd_clients(model: nn.Module, states: list[State], xs: list[Tensor], ys: list[Tensor], lrs: list[float],
                cfg: LocalConfig, gens: list[torch.Generator]) -> list[tuple[State, float]]:
    """`sgd_client` for several clients as one vmapped computation (core.batched.finetune_many): plain SGD is
    fine-tuning with every BN layer on its batch's statistics (beta 1) and its running statistics moving, one LR for
    every tensor (0 for FedBABU's head). Per client the same update to float rounding."""
    from ..core.batched import finetune_many
    from ..core.finetune import Strategy
    names = [n for n, _ in model.named_parameters()]
    bns, stats = _running(model, states)
    train = torch.tensor([not (cfg.freeze_head and n.startswith(cfg.head)) for n in names])
    dev = ys[0].device
    strategies = [Strategy(torch.ones(len(bns), device=dev), (lr * train).to(dev)) for lr in lrs]
    fts = finetune_many(model, [{n: st[n] for n in names} for st in states], xs, ys, strategies, stats, cfg.epochs,
                        cfg.batch_size, gens, "running")
    return [(_state(st, bns, ft.params, ft.bn), float(ft.train_loss)) for st, ft in zip(states, fts)]


def _running(model: nn.Module, states: list[State]) -> tuple[list[str], list[ClientBN]]:
    """The model's BN layers and each state's running statistics."""
    bns = [n for n, _ in bn_layers(model)]
    return bns, [ClientBN([st[f"{b}.running_mean"] for b in bns], [st[f"{b}.running_var"] for b in bns]) for st in states]


def _state(state: State, bns: list[str], params: State, bn: ClientBN) -> State:
    """`state` with the new weights and running statistics (detached)."""
    running = {f"{b}.running_{k}": v for b, m, var in zip(bns, bn.mean, bn.var) for k, v in (("mean", m), ("var", var))}
    return {k: v.detach() for k, v in (state | params | running).items()}


def perfedavg_hf_step(model: nn.Module, params: State, batches: tuple, alpha: float, beta: float) -> tuple[State, Tensor]:
    """One Per-FedAvg (HF) step on three independent batches D, D', D'' (`core.perfedavg.perfedavg_step`, one client
    by torch.autograd): w_tmp = w - alpha grad f(w; D);  w <- w - beta (I - alpha H(w; D'')) grad f(w_tmp; D')."""
    from ..core.autodiff import AUTOGRAD
    from ..core.perfedavg import perfedavg_step
    new, loss, _ = perfedavg_step(AUTOGRAD, model, params, [b[0] for b in batches], [b[1] for b in batches], alpha, beta)
    return new, loss


def perfedavg_client(model: nn.Module, state: State, x: Tensor, y: Tensor, lr: float, cfg: LocalConfig,
                     gen: torch.Generator) -> tuple[State, float]:
    """Per-FedAvg (HF): each step draws three independent batches; an epoch is n / (3 batch) steps."""
    set_state(model, state).train()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses = []
    for _ in range(perfedavg_steps(len(y), cfg)):
        batches = tuple((x[i], y[i]) for i in (random_batch(len(y), cfg.batch_size, gen, x.device) for _ in range(3)))
        params, l = perfedavg_hf_step(model, params, batches, cfg.pf_alpha, lr)
        losses.append(l)
    set_state(model, {**get_state(model), **params})
    return get_state(model), mean_loss(losses)


def perfedavg_steps(n: int, cfg: LocalConfig) -> int:
    """Per-FedAvg (HF)'s local steps for a client of n samples: an epoch is n / (3 batch) steps, at least one."""
    return max(1, n // (3 * cfg.batch_size)) * cfg.epochs


def perfedavg_clients(model: nn.Module, states: list[State], xs: list[Tensor], ys: list[Tensor], lrs: list[float],
                      cfg: LocalConfig, gens: list[torch.Generator]) -> list[tuple[State, float]]:
    """`perfedavg_client` for several clients as one vmapped computation per step (core.batched.perfedavg_many):
    each client draws its three batches per step from its own generator in the same order, and a client with fewer
    steps waits. Per client the same update to float rounding; the losses are read once for the group."""
    from ..core.batched import perfedavg_many
    names = [n for n, _ in model.named_parameters()]
    bns, stats = _running(model, states)
    draws = [[random_batch(len(y), cfg.batch_size, g, x.device) for _ in range(3 * perfedavg_steps(len(y), cfg))]
             for x, y, g in zip(xs, ys, gens)]
    out = perfedavg_many(model, [{n: st[n] for n in names} for st in states], stats, xs, ys, draws, cfg.pf_alpha, lrs)
    losses = torch.stack([loss for _, _, loss in out]).tolist()
    return [(_state(st, bns, p, bn), loss) for st, (p, bn, _), loss in zip(states, out, losses)]
