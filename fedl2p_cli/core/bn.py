"""Batch norm with a per-call statistics policy: BN C, BN G, BN I and FedL2P's beta mixing (Eq. 2).

`MixBN` behaves exactly like `nn.BatchNorm{1,2}d` unless a `BNPolicy` is active. Under a policy the
normalising statistics are mu = (1-beta) mu_pt + beta mu_client (same for var), where mu_pt are the
layer's buffers (the pretrained running statistics) and mu_client are the batch statistics in training
forwards and the client's running statistics in evaluation forwards. Batch statistics are computed as a
pure function of the input, so the layer composes with higher-order autograd.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_POLICY: contextvars.ContextVar[BNPolicy | None] = contextvars.ContextVar("bn_policy", default=None)


class MixBN(nn.Module):
    """BatchNorm over dim 1 (works for [N,C] and [N,C,H,W]) that consults the active policy."""

    running_mean: Tensor  # buffers (register_buffer): typed here for the type checker
    running_var: Tensor

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.bn_index = -1  # position among the model's BN layers, set by the model factory

    def forward(self, x: Tensor) -> Tensor:
        policy = _POLICY.get()
        if policy is None:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                self.training, self.momentum, self.eps)
        return policy.normalize(self, x)


def _expand(v: Tensor, x: Tensor) -> Tensor:
    return v.view(1, -1, *([1] * (x.dim() - 2)))


def _dims(x: Tensor) -> list[int]:
    return [0] + list(range(2, x.dim()))


def batch_moments(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel mean and biased variance of x [N, C, ...] (two passes; torch.var_mean over N,H,W is ~10x slower on CPU)."""
    dims = _dims(x)
    mean = x.mean(dims)
    return mean, (x - _expand(mean, x)).square().mean(dims)


class MixedBatchNorm(torch.autograd.Function):
    """Training-mode BN normalising with mu = (1-b) mu_pt + b mu_B (same for the variance), mu_B and var_B (biased)
    the batch's: the same function as the composite path, with a hand-derived backward of 2 full-size passes
    (autograd's is ~10). The backward is written in differentiable ops on the saved inputs, so it supports the
    double backward of the hypergradient; its derivation:
        s = w / sqrt(var + eps);  S_g = sum g;  S_c = sum g (x - mu)
        dbias = S_g;  dw = S_c / sqrt(var + eps);  dmu = -s S_g;  dvar = -s S_c / (2 (var + eps))
        db = sum_c (mu_B - mu_pt) dmu + (var_B - var_pt) dvar
        dx = s g + (2 b dvar / N) (x - mu_B) + b dmu / N
    Returns (out, mu_B, var_B); the batch moments are for recording only (not differentiable outputs)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, bias: Tensor, b: Tensor, rm: Tensor, rv: Tensor,
                eps: float) -> tuple[Tensor, Tensor, Tensor]:
        mean_b, var_b = batch_moments(x)
        mean, var = torch.lerp(rm, mean_b, b), torch.lerp(rv, var_b, b)
        scale = torch.rsqrt(var + eps) * w
        ctx.save_for_backward(x, w, b, rm, rv)
        ctx.eps, ctx.moments = eps, (mean_b, var_b)
        ctx.mark_non_differentiable(mean_b, var_b)
        return torch.addcmul(_expand(bias - mean * scale, x), x, _expand(scale, x)), mean_b, var_b

    @staticmethod
    def backward(ctx: Any, g: Tensor, _gm: Tensor,
                 _gv: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, None, None, None]:
        x, w, b, rm, rv = ctx.saved_tensors
        dims, n = _dims(x), x.numel() // x.shape[1]
        # a backward that will itself be differentiated needs the moments as functions of x; otherwise reuse them
        mean_b, var_b = batch_moments(x) if torch.is_grad_enabled() else ctx.moments
        mean, var = torch.lerp(rm, mean_b, b), torch.lerp(rv, var_b, b)
        r = torch.rsqrt(var + ctx.eps)
        s = w * r
        s_g, s_gx = g.sum(dims), (g * x).sum(dims)
        s_c = s_gx - mean * s_g
        dmu, dvar = -s * s_g, -0.5 * s * r * r * s_c
        k = (2.0 / n) * b * dvar
        shift = (b / n) * dmu - k * mean_b
        dx = torch.addcmul(torch.addcmul(_expand(shift, x), x, _expand(k, x)), g, _expand(s, x))
        db = ((mean_b - rm) * dmu + (var_b - rv) * dvar).sum().reshape(b.shape)
        return dx, r * s_c, s_g, db, None, None, None


@dataclass
class BNPolicy:
    """Where normalising statistics come from in one forward.

    beta: [B] mixing weights (None: client statistics only, i.e. BN I when `train` holds too).
    client_mean/var: the client's running statistics per BN layer (used when not `train`).
    train: use the batch's statistics as the client's statistics, and record them.
    """

    beta: Tensor | None
    client_mean: list[Tensor] | None = None
    client_var: list[Tensor] | None = None
    train: bool = True
    recorded: dict[int, tuple[Tensor, Tensor, int]] = field(default_factory=dict)
    fused: bool = False  # first-order fine-tuning only (training forwards; see _fused): not for graphs differentiated twice
    levels: list[float] | None = None  # beta on the host (fused path): choosing a kernel then needs no device read

    def _fused(self, m: MixBN, x: Tensor) -> Tensor | None:
        """BN C / BN I (beta 1 or none) and BN G (beta 0) layers through F.batch_norm's fused kernels, the path a
        plain nn.BatchNorm takes; the batch moments are recorded through its running-statistics output (momentum 1:
        mean and unbiased variance). None for a mixed beta, which takes the general path."""
        if self.beta is None:  # noqa: SIM108 -- one conditional expression inside another reads worse
            b = None
        else:
            b = self.levels[m.bn_index] if self.levels is not None else float(self.beta[m.bn_index])
        if b is not None and b not in (0.0, 1.0):
            return None
        n = x.numel() // x.shape[1]
        if b == 0.0:
            with torch.no_grad():
                var, mean = torch.var_mean(x, [0] + list(range(2, x.dim())), correction=0)
            self.recorded[m.bn_index] = (mean, var, n)
            return F.batch_norm(x, m.running_mean, m.running_var, m.weight, m.bias, False, 0.0, m.eps)
        mean, var = torch.zeros_like(m.running_mean), torch.zeros_like(m.running_var)  # not empty: 0 * NaN garbage = NaN
        out = F.batch_norm(x, mean, var, m.weight, m.bias, True, 1.0, m.eps)
        self.recorded[m.bn_index] = (mean, var * ((n - 1) / n), n)
        return out

    def normalize(self, m: MixBN, x: Tensor) -> Tensor:
        if self.fused and self.train:
            out = self._fused(m, x)
            if out is not None:
                return out
        i = m.bn_index
        if self.train or self.client_mean is None or self.client_var is None:  # batch statistics: MixedBatchNorm's backward
            b = x.new_ones(()) if self.beta is None else self.beta[i]
            out, cm, cv = MixedBatchNorm.apply(x, m.weight, m.bias, b, m.running_mean, m.running_var, m.eps)
            if self.train:
                self.recorded[i] = (cm, cv, x.numel() // x.shape[1])
            return cast(Tensor, out)
        cm, cv = self.client_mean[i], self.client_var[i]
        if self.beta is None:
            mean, var = cm, cv
        else:
            b = self.beta[i]
            mean = (1 - b) * m.running_mean + b * cm
            var = (1 - b) * m.running_var + b * cv
        return normalize_with(m, x, mean, var)

    def mixed(self, m: MixBN, mean_b: Tensor, var_b: Tensor) -> tuple[Tensor, Tensor]:
        """Eq. 2 with batch moments: the pretrained statistics and (mean_b, var_b) mixed by the layer's beta (1
        without one)."""
        b = mean_b.new_ones(()) if self.beta is None else self.beta[m.bn_index]
        return torch.lerp(m.running_mean, mean_b, b), torch.lerp(m.running_var, var_b, b)


class PathPolicy(BNPolicy):
    """Training-mode BN mixing by beta whose batch moments stay differentiable functions of the weights (where
    MixedBatchNorm records them as constants): `finetune.precise_bn_path`'s forward."""

    def normalize(self, m: MixBN, x: Tensor) -> Tensor:
        mean_b, var_b = batch_moments(x)
        self.recorded[m.bn_index] = (mean_b, var_b, x.numel() // x.shape[1])
        return normalize_with(m, x, *self.mixed(m, mean_b, var_b))


def normalize_with(m: MixBN, x: Tensor, mean: Tensor, var: Tensor) -> Tensor:
    """x normalised by per-channel (mean, var) under the layer's affine weights: one fused pass x * scale + shift."""
    scale = torch.rsqrt(var + m.eps) * m.weight
    return torch.addcmul(_expand(m.bias - mean * scale, x), x, _expand(scale, x))


@contextmanager
def policy(p: BNPolicy | None) -> Iterator[BNPolicy | None]:
    token = _POLICY.set(p)
    try:
        yield p
    finally:
        _POLICY.reset(token)


def update_running(client_mean: list[Tensor], client_var: list[Tensor], recorded: dict, momentum: float = 0.1) -> None:
    """Move the client's running statistics towards the recorded batch statistics (unbiased var)."""
    for i, (m, v, n) in recorded.items():
        client_mean[i] = (1 - momentum) * client_mean[i] + momentum * m
        client_var[i] = (1 - momentum) * client_var[i] + momentum * v * (n / max(n - 1, 1))
    recorded.clear()


def bn_layers(model: nn.Module) -> list[tuple[str, MixBN]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, MixBN)]


def index_bn_layers(model: nn.Module) -> nn.Module:
    for i, (_, m) in enumerate(bn_layers(model)):
        m.bn_index = i
    return model
