"""Personalised fine-tuning under a strategy: BN statistics policy (beta) and per-tensor learning rates."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .autodiff import AUTOGRAD, Transforms
from .bn import BNPolicy, MixBN, PathPolicy, update_running
from .functional import Params, ce_loss, epochs_of_batches, evaluate, evaluate_sums, forward, mean_loss
from .masked import MaskedPolicy, masked_ce


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

    def copy(self) -> ClientBN:
        return ClientBN([m.clone() for m in self.mean], [v.clone() for v in self.var])


@dataclass
class Replay:
    """What replays a fine-tuning step by step (`--lr-grad unrolled` differentiates it): the starting parameters, the
    client's training data, every step's batch indices in order and the LRs. References, no copies."""

    start: Params
    x: Tensor
    y: Tensor
    batches: list[Tensor]
    lr: Tensor


@dataclass
class FinetuneResult:
    """What a client's fine-tuning hands its meta-gradient and LR meta-gradient (api.FinetuneResult)."""
    params: Params  # theta* after the last step
    bn: ClientBN
    prev_params: Params  # parameters before the last step (for FOMAML+ and the IFT's last-step reading)
    last_batch: Tensor
    train_loss: float | Tensor  # mean over the steps: read once, or (a batched group's) a 0-dim tensor read at its end
    last_grad: list[Tensor]  # that step's gradient: params = prev_params - lr * last_grad
    grad_sum: list[Tensor] | None = None  # every step's gradient summed: params = start - lr * grad_sum (constant lr)
    replay: Replay | None = None  # the fine-tuning, step by step


def sgd_step(model: nn.Module, params: Params, x: Tensor, y: Tensor, s: Strategy, bn: ClientBN) -> tuple[Params, float]:
    """theta <- theta - eta * grad CE(f_{theta,beta}(x), y), and the client's running statistics move."""
    levels = None if s.beta is None else s.beta.tolist()  # one device read for every layer's kernel choice
    new, loss, _ = step_with_grad(model, params, x, y, s, bn, levels)
    return new, loss.item()


def step_with_grad(model: nn.Module, params: Params, x: Tensor, y: Tensor, s: Strategy, bn: ClientBN,
                   levels: list[float] | None = None) -> tuple[Params, Tensor, list[Tensor]]:
    """`sgd_step` that also returns the step's gradient (the IFT's last-step reading reuses it): `train_step` by
    torch.autograd. The loss stays a device tensor (no host sync per step); `levels`: beta on the host, read once per
    fine-tuning (`finetune`)."""
    new, loss, grads, moments = train_step(AUTOGRAD, model, params, x, y, s.beta, s.lr, levels=levels)
    update_running(bn.mean, bn.var, dict(moments))
    return new, loss, grads


def train_step(d: Transforms, model: nn.Module, params: Params, x: Tensor, y: Tensor, beta: Tensor | None, lr: Tensor,
               mask: Tensor | None = None, levels: list[float] | None = None
               ) -> tuple[Params, Tensor, list[Tensor], list[tuple[int, tuple[Tensor, Tensor, Any]]]]:
    """One client's SGD step theta <- theta - eta * grad CE(f_{theta,beta}(x), y), by the transforms `d`: the new
    weights, the loss, the gradient and each BN layer's batch moments (index, (mean, biased variance, count)), from
    which the caller moves the running statistics. One client (mask None) takes the fused kernels at beta 0/1 (first
    order only); a vmapped group (`core.batched`) passes each client's padded batch's mask."""
    order: list[int] = []  # the BN indices, beside the aux (torch.func's aux holds tensors only)

    def loss_fn(p: Params) -> tuple[Tensor, tuple[Tensor, list]]:
        if mask is None:
            pol: BNPolicy = BNPolicy(beta, train=True, fused=True, levels=levels)
            loss = ce_loss(model, p, x, y, pol)
            moments: dict = pol.recorded
        else:
            pol = masked = MaskedPolicy(beta, train=True, mask=mask)
            loss = masked_ce(model, p, x, y, mask, pol)
            moments = masked.moments
        order[:] = sorted(moments)
        return loss, (loss.detach(), [moments[i] for i in order])

    g, (loss, moments) = d.grad(loss_fn, has_aux=True)(params)
    new = {k: v.detach() - e * g[k] for (k, v), e in zip(params.items(), lr)}
    return new, loss, [g[k] for k in params], list(zip(order, moments))


def finetune(model: nn.Module, params: Params, x: Tensor, y: Tensor, s: Strategy, bn: ClientBN, epochs: int,
             batch_size: int, gen: torch.Generator, client_bn: str = "precise") -> FinetuneResult:
    """e epochs of SGD under (beta, eta). client_bn="precise" then recomputes the client's BN statistics under the
    fine-tuned weights and the same beta (`precise_bn`); "running" keeps the momentum-0.1 running statistics
    started from the stored ones (the paper's behaviour, stale for layers >= 2)."""
    bn = bn.copy()
    start, batches = params, epochs_of_batches(len(y), batch_size, gen, epochs, x.device)
    prev, last, losses = params, torch.arange(min(batch_size, len(y)), device=y.device), []
    grad = [torch.zeros_like(v) for v in params.values()]
    gsum = [torch.zeros_like(v) for v in params.values()]
    s = Strategy(None if s.beta is None else s.beta.detach(), s.lr.detach())
    levels = None if s.beta is None else s.beta.tolist()  # the fused-kernel choice per layer, read once
    for idx in batches:
        prev, last = params, idx
        params, l, grad = step_with_grad(model, params, x[idx], y[idx], s, bn, levels)
        gsum = [a + b for a, b in zip(gsum, grad)]
        losses.append(l)
    if client_bn == "precise" and s.beta is not None:
        bn = precise_bn(model, params, x, s.beta)
    return FinetuneResult(params, bn, prev, last, mean_loss(losses), grad, gsum, Replay(start, x, y, batches, s.lr))


class _Stop(Exception):
    """Ends a statistics forward once the layer being measured has been seen."""


class _LayerwisePolicy(BNPolicy):
    """Layers before `target` normalise with the finished client statistics (mixed by beta); `target` accumulates
    the moments of its input (float64 sums) and the forward stops there."""

    def __init__(self, beta: Tensor, mean: list[Tensor], var: list[Tensor], target: int, acc: list[Tensor]):
        super().__init__(beta, mean, var, train=False)
        self.target, self.acc = target, acc

    def normalize(self, m: MixBN, x: Tensor) -> Tensor:
        if m.bn_index < self.target:
            return super().normalize(m, x)
        if m.bn_index == self.target:
            dims = [0] + list(range(2, x.dim()))
            xd = x.double()
            self.acc[0] += xd.sum(dims)
            self.acc[1] += xd.pow(2).sum(dims)
            self.acc[2] += x.numel() // x.shape[1]
        raise _Stop


@torch.no_grad()
def precise_bn(model: nn.Module, params: Params, x: Tensor, beta: Tensor, chunk: int = 1024) -> ClientBN:
    """The client's population BN statistics under `params` and `beta` (PreciseBN, Wu & Johnson 2021): layer b's
    statistics are those of its input when every earlier layer normalises with its own client statistics mixed by
    beta, i.e. exactly what a beta-mixed evaluation forward feeds it. Up to `chunk` samples: one full-batch
    training-mode forward. Larger clients: one chunked pass per BN layer (each stops at its layer)."""
    if len(x) <= chunk:
        return ClientBN(*full_batch_moments(model, params, x, beta))
    n_bn = len(beta)
    mean: list[Tensor] = [x.new_empty(0)] * n_bn
    var: list[Tensor] = [x.new_empty(0)] * n_bn
    for b in range(n_bn):
        acc: list = [0.0, 0.0, 0]
        for i in range(0, len(x), chunk):
            with contextlib.suppress(_Stop):
                forward(model, params, x[i:i + chunk], _LayerwisePolicy(beta, mean, var, b, acc))
        mu = acc[0] / acc[2]
        mean[b], var[b] = mu.float(), (acc[1] / acc[2] - mu * mu).clamp_min(0).float()
    return ClientBN(mean, var)


def full_batch_moments(model: nn.Module, params: Params, x: Tensor, beta: Tensor,
                       mask: Tensor | None = None) -> tuple[list[Tensor], list[Tensor]]:
    """Each BN layer's input moments (mean, biased variance) in one training-mode forward of all of x under beta:
    `precise_bn`'s statistics. `mask`: a padded data set's own samples (a vmapped group, `core.batched`)."""
    pol = BNPolicy(beta, train=True) if mask is None else MaskedPolicy(beta, train=True, mask=mask)
    forward(model, params, x, pol)
    moments: dict = pol.moments if isinstance(pol, MaskedPolicy) else pol.recorded
    order = sorted(moments)
    return [moments[i][0] for i in order], [moments[i][1] for i in order]


def precise_bn_path(model: nn.Module, params: Params, x: Tensor, beta: Tensor) -> ClientBN:
    """`precise_bn` (one full-batch forward) with the statistics differentiable in `params`: evaluation recomputes the
    client's statistics after fine-tuning, so a change of the fine-tuned weights reaches the validation loss through
    them too (`--lr-grad trajectory-bn`)."""
    pol = PathPolicy(beta, train=True)
    forward(model, params, x, pol)
    return recorded_bn(pol)


def recorded_bn(pol: BNPolicy) -> ClientBN:
    """The client statistics a full-batch training-mode forward under `pol` recorded, layer by layer."""
    order = sorted(pol.recorded)
    return ClientBN([pol.recorded[i][0] for i in order], [pol.recorded[i][1] for i in order])


def inference_policy(beta: Tensor | None, bn: ClientBN, stats: str = "running") -> BNPolicy:
    """Test-time statistics. BN I (beta None), and any beta with stats="test-batch" (not in the paper): each batch's
    own, mixed by beta with the pretrained ones as in training (at beta 1 that is BN I's transductive evaluation).
    Otherwise (the paper's inference, Eq. 2 with running estimates) beta mixes the client's statistics bn."""
    if beta is None or stats == "test-batch":
        return BNPolicy(beta, None, None, train=False)
    return BNPolicy(beta, bn.mean, bn.var, train=False)


def eval_policy(s: Strategy, bn: ClientBN, stats: str = "running") -> BNPolicy:
    return inference_policy(s.beta, bn, stats)


def personalized_accuracy(model: nn.Module, params: Params, x: Tensor, y: Tensor, s: Strategy, bn: ClientBN,
                          batch_size: int, eval_stats: str = "running") -> tuple[float, float]:
    """Loss and accuracy under `inference_policy`; batch statistics are taken over batches of `batch_size`."""
    pol = eval_policy(s, bn, eval_stats)
    return evaluate(model, params, x, y, pol, batch_size if pol.client_mean is None else 512)


def personalized_sums(model: nn.Module, params: Params, x: Tensor, y: Tensor, s: Strategy, bn: ClientBN,
                      batch_size: int, eval_stats: str = "running") -> Tensor:
    """`personalized_accuracy`'s summed loss and count of correct answers as one float64 [2] tensor, on the device:
    the caller reads many at once (`per_sample` turns the read into `personalized_accuracy`'s floats)."""
    pol = eval_policy(s, bn, eval_stats)
    loss, correct = evaluate_sums(model, params, x, y, pol, batch_size if pol.client_mean is None else 512)
    return torch.stack([loss.double(), correct.double()])


def per_sample(sums: list[float], n: int) -> tuple[float, float]:
    """(loss, accuracy) from `personalized_sums`' values read to the host: `evaluate`'s arithmetic exactly."""
    n = max(n, 1)
    return sums[0] / n, sums[1] / n


def personalized_loss_sum(model: nn.Module, params: Params, x: Tensor, y: Tensor, s: Strategy, bn: ClientBN,
                          batch_size: int, eval_stats: str = "running") -> Tensor:
    """`personalized_accuracy`'s summed loss (float64), on the device: the caller reads many at once."""
    pol = eval_policy(s, bn, eval_stats)
    return evaluate_sums(model, params, x, y, pol, batch_size if pol.client_mean is None else 512)[0]
