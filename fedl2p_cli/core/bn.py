"""Batch norm with a per-call statistics policy: BN C, BN G, BN I and FedL2P's beta mixing (Eq. 2).

`MixBN` behaves exactly like `nn.BatchNorm{1,2}d` unless a `BNPolicy` is active. Under a policy the
normalising statistics are mu = (1-beta) mu_pt + beta mu_client (same for var), where mu_pt are the
layer's buffers (the pretrained running statistics) and mu_client are the batch statistics in training
forwards and the client's running statistics in evaluation forwards. Batch statistics are computed as a
pure function of the input, so the layer composes with higher-order autograd.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_POLICY: contextvars.ContextVar["BNPolicy | None"] = contextvars.ContextVar("bn_policy", default=None)


class MixBN(nn.Module):
    """BatchNorm over dim 1 (works for [N,C] and [N,C,H,W]) that consults the active policy."""

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


def batch_moments(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel mean and biased variance of x [N, C, ...]."""
    dims = [0] + list(range(2, x.dim()))
    mean = x.mean(dims)
    return mean, (x - _expand(mean, x)).pow(2).mean(dims)


def _expand(v: Tensor, x: Tensor) -> Tensor:
    return v.view(1, -1, *([1] * (x.dim() - 2)))


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

    def _fused(self, m: MixBN, x: Tensor) -> Tensor | None:
        """BN C / BN I (beta 1 or none) and BN G (beta 0) layers through F.batch_norm's fused kernels, the path a
        plain nn.BatchNorm takes; the batch moments are recorded through its running-statistics output (momentum 1:
        mean and unbiased variance). None for a mixed beta, which takes the general path."""
        b = None if self.beta is None else float(self.beta[m.bn_index])
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
        if self.train or self.client_mean is None:
            cm, cv = batch_moments(x)
            if self.train:
                self.recorded[i] = (cm.detach(), cv.detach(), x.numel() // x.shape[1])
        else:
            cm, cv = self.client_mean[i], self.client_var[i]
        if self.beta is None:
            mean, var = cm, cv
        else:
            b = self.beta[i]
            mean = (1 - b) * m.running_mean + b * cm
            var = (1 - b) * m.running_var + b * cv
        scale = torch.rsqrt(var + m.eps) * m.weight  # per channel; then one fused pass over x: x * scale + shift
        return torch.addcmul(_expand(m.bias - mean * scale, x), x, _expand(scale, x))


@contextmanager
def policy(p: BNPolicy | None):
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
