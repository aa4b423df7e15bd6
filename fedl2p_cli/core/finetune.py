"""Personalised fine-tuning under a strategy: BN statistics policy (beta) and per-tensor learning rates."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .bn import BNPolicy, update_running
from .functional import Params, ce_loss, evaluate, shuffled_batches


@dataclass
class Strategy:
    """beta: [B] mixing ratios (None: BN I, batch statistics everywhere); lr: [|P|] per-tensor LRs."""

    beta: Tensor | None
    lr: Tensor


@dataclass
class ClientBN:
    """The client's running BN statistics, started from its stored statistics (not 0/1)."""

    mean: list[Tensor]
    var: list[Tensor]

    def copy(self) -> "ClientBN":
        return ClientBN([m.clone() for m in self.mean], [v.clone() for v in self.var])


@dataclass
class FinetuneResult:
    params: Params
    bn: ClientBN
    prev_params: Params  # parameters before the last step (for FOMAML+)
    last_batch: Tensor
    train_loss: float


def sgd_step(model: nn.Module, params: Params, x: Tensor, y: Tensor, s: Strategy, bn: ClientBN) -> tuple[Params, float]:
    """theta <- theta - eta * grad CE(f_{theta,beta}(x), y), and the client's running statistics move."""
    leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    pol = BNPolicy(s.beta, train=True)
    loss = ce_loss(model, leaves, x, y, pol)
    grads = torch.autograd.grad(loss, list(leaves.values()))
    with torch.no_grad():
        new = {k: v - lr * g for (k, v), lr, g in zip(leaves.items(), s.lr, grads)}
    update_running(bn.mean, bn.var, pol.recorded)
    return new, loss.item()


def finetune(model: nn.Module, params: Params, x: Tensor, y: Tensor, s: Strategy, bn: ClientBN, epochs: int,
             batch_size: int, gen: torch.Generator) -> FinetuneResult:
    bn = bn.copy()
    prev, last, losses = params, torch.arange(min(batch_size, len(y))), []
    s = Strategy(None if s.beta is None else s.beta.detach(), s.lr.detach())
    for _ in range(epochs):
        for idx in shuffled_batches(len(y), batch_size, gen):
            prev, last = params, idx
            params, l = sgd_step(model, params, x[idx], y[idx], s, bn)
            losses.append(l)
    return FinetuneResult(params, bn, prev, last, sum(losses) / max(len(losses), 1))


def eval_policy(s: Strategy, bn: ClientBN) -> BNPolicy:
    """Inference statistics: BN I uses the test batch's, otherwise beta mixes the client's running ones."""
    if s.beta is None:
        return BNPolicy(None, None, None, train=False)
    return BNPolicy(s.beta, bn.mean, bn.var, train=False)


def personalized_accuracy(model: nn.Module, params: Params, x: Tensor, y: Tensor, s: Strategy, bn: ClientBN,
                  batch_size: int) -> tuple[float, float]:
    return evaluate(model, params, x, y, eval_policy(s, bn), batch_size if s.beta is None else 512)
