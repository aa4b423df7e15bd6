"""BNNet and LRNet (App. E) as functional MLPs, and lambda = {w_bn, w_lr, eta~} as one flat dict."""

from __future__ import annotations

import math

import torch
from torch import Tensor

Lambda = dict[str, Tensor]
HIDDEN = 100
BETA_RANGE, LR_RANGE = (0.0, 1.0), (0.0, 1000.0)
GROUPS = ("bnnet", "lrnet", "eta")
DEFAULT_META_LR = {"bnnet": 1e-3, "lrnet": 1e-3, "eta": 1e-4}


def clamp_ste(x: Tensor, lo: float, hi: float) -> Tensor:
    """Clamp in the forward pass, identity gradient in the backward pass (straight-through)."""
    return x + (x.clamp(lo, hi) - x).detach()


def init_mlp(prefix: str, d_in: int, d_out: int, bias: float, gen: torch.Generator, gain: float = 0.1) -> Lambda:
    """3-layer MLP d_in -> 100 -> 100 -> d_out; Xavier-normal (gain 0.1) weights. The output bias is the constant
    that sets the initial output (App. E: 0.5 for BNNet, 1.0 for LRNet); hidden biases are 0 so that hidden units
    do not shift it (with constant hidden biases LRNet would start +-20% off per tensor)."""
    dims = [d_in, HIDDEN, HIDDEN, d_out]
    out: Lambda = {}
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        std = gain * math.sqrt(2.0 / (a + b))
        out[f"{prefix}.{i}.weight"] = torch.randn(b, a, generator=gen) * std
        out[f"{prefix}.{i}.bias"] = torch.full((b,), float(bias) if i == len(dims) - 2 else 0.0)
    return out


def mlp(lam: Lambda, prefix: str, x: Tensor) -> Tensor:
    h = x
    for i in range(3):
        h = torch.nn.functional.linear(h, lam[f"{prefix}.{i}.weight"], lam[f"{prefix}.{i}.bias"])
        if i < 2:
            h = torch.relu(h)
    return h


def init_lambda(n_bn: int, n_x: int, n_params: int, base_lr: float, nets: str, seed: int) -> Lambda:
    """nets: 'both', 'bnnet' (LRs fixed at base_lr) or 'lrnet' (beta fixed)."""
    gen = torch.Generator().manual_seed(seed)
    lam: Lambda = {}
    if nets in ("both", "bnnet"):
        lam |= init_mlp("bnnet", n_bn, n_bn, 0.5, gen)
    if nets in ("both", "lrnet"):
        lam |= init_mlp("lrnet", n_x, n_params, 1.0, gen)
        lam["eta"] = torch.full((n_params,), float(base_lr))
    return lam


def hyperparameters(lam: Lambda, xi: Tensor, x: Tensor, n_params: int, base_lr: float,
                    fixed_beta: float) -> tuple[Tensor, Tensor]:
    """Eq. 4: beta = BNNet(xi) in [0,1]; eta = LRNet(x) in [0,1000] times eta~ (per parameter tensor)."""
    if "bnnet.0.weight" in lam:
        beta = clamp_ste(mlp(lam, "bnnet", xi), *BETA_RANGE)
    else:
        beta = torch.full((xi.numel(),), float(fixed_beta), dtype=xi.dtype)
    if "lrnet.0.weight" in lam:
        eta = clamp_ste(mlp(lam, "lrnet", x), *LR_RANGE) * lam["eta"]
    else:
        eta = torch.full((n_params,), float(base_lr), dtype=x.dtype)
    return beta, eta


def group_of(name: str) -> str:
    return name.split(".")[0]


def sgd_update(lam: Lambda, grads: Lambda, lrs: dict[str, float], clip: float = 1.0) -> Lambda:
    """lambda <- lambda - zeta * clip(g, [-1, 1]), with a learning rate per group."""
    return {k: v - lrs[group_of(k)] * grads[k].clamp(-clip, clip) for k, v in lam.items()}
