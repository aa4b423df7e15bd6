"""BNNet and LRNet (App. E), run as `core.mlp` templates on lambda = {w_bn, w_lr, eta~}, one flat dict."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import get_args

import torch
from torch import Tensor

from . import mlp
from .settings import BetaOutput, HiddenBias

Lambda = dict[str, Tensor]
HIDDEN = 100
BETA_RANGE, LR_RANGE = (0.0, 1.0), (0.0, 1000.0)
GROUPS = ("bnnet", "lrnet", "eta", "logeta")
# --head log: LRNet's output is a log-multiplier of eta~, soft-bounded to +-ln 100 (x0.01 .. x100 of eta~)
LOG_LR_RANGE = math.log(100.0)

HIDDEN_BIAS = get_args(HiddenBias)  # App. E: every bias is the constant; "zero": hidden biases 0 (an ablation)


def clamp_ste(x: Tensor, lo: float, hi: float) -> Tensor:
    """Clamp in the forward pass, identity gradient in the backward pass (straight-through)."""
    return x + (x.clamp(lo, hi) - x).detach()


def init_mlp(prefix: str, d_in: int, d_out: int, bias: float, gen: torch.Generator, gain: float = 0.1,
             hidden_bias: str = "paper", out_bias: float | None = None) -> Lambda:
    """3-layer MLP d_in -> 100 -> 100 -> d_out (`DIMS`); Xavier-normal (gain 0.1) weights and, as App. E and the
    authors' `weights_init` do, *every* bias set to the constant (0.5 BNNet, 1.0 LRNet). The constant hidden biases
    keep the hidden units active, so gradient reaches the input weights (with zero hidden biases only the output
    bias learns). `hidden_bias="zero"` is the ablation that zeroes the hidden biases; `out_bias` (default: `bias`)
    sets the output layer's bias alone."""
    if hidden_bias not in HIDDEN_BIAS:
        raise ValueError(f"hidden_bias must be one of {HIDDEN_BIAS}")
    out: Lambda = {}
    for wk, bk, b, a, last in _layers(prefix, d_in, d_out):
        std = gain * math.sqrt(2.0 / (a + b))
        out[wk] = torch.randn(b, a, generator=gen, device=gen.device) * std
        value = (bias if out_bias is None else out_bias) if last else (bias if hidden_bias == "paper" else 0.0)
        out[bk] = torch.full((b,), float(value), device=gen.device)
    return out


def _layers(prefix: str, d_in: int, d_out: int) -> Iterator[tuple[str, str, int, int, bool]]:
    """Each layer of a meta-net, in the order they run: its weight's and bias's keys, out and in widths, and whether
    it is the output layer."""
    layers = list(mlp.shapes(dims(d_in, d_out), prefix).items())
    for i in range(0, len(layers), 2):
        (wk, (b, a)), (bk, _) = layers[i], layers[i + 1]
        yield wk, bk, b, a, i == len(layers) - 2


def dims(d_in: int, d_out: int) -> tuple[int, ...]:
    """BNNet's and LRNet's layer widths (App. E)."""
    return (d_in, HIDDEN, HIDDEN, d_out)


def shapes(n_bn: int, n_x: int, n_params: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of a full lambda and its shape: BNNet xi -> beta, LRNet x -> eta's scale, eta~."""
    return mlp.shapes(dims(n_bn, n_bn), "bnnet") | mlp.shapes(dims(n_x, n_params), "lrnet") | {"eta": (n_params,)}


def init_lambda(n_bn: int, n_x: int, n_params: int, base_lr: float, nets: str, seed: int,
                hidden_bias: str = "paper", beta_init: float = 0.5, gain: float = 0.1,
                beta_output: BetaOutput = "ste-clamp") -> Lambda:
    """nets: 'both', 'bnnet' (LRs fixed at base_lr) or 'lrnet' (beta fixed). beta_init: BNNet's bias constant
    (App. E: 0.5), hence every client's initial beta up to the small spread of the gain-0.1 weights. gain: the
    weights' Xavier gain (App. E: 0.1; larger makes the outputs depend on the inputs from the start). With
    beta_output="sigmoid" BNNet's output bias is logit(beta_init), so the initial beta is still ~beta_init."""
    gen = torch.Generator().manual_seed(seed)
    lam: Lambda = {}
    if nets in ("both", "bnnet"):
        out_bias = logit(beta_init) if beta_output == "sigmoid" else None
        lam |= init_mlp("bnnet", n_bn, n_bn, beta_init, gen, gain, hidden_bias, out_bias)
    if nets in ("both", "lrnet"):
        lam |= init_mlp("lrnet", n_x, n_params, 1.0, gen, gain, hidden_bias)
        lam["eta"] = torch.full((n_params,), float(base_lr), device=gen.device)
    return lam


def init_log_mlp(prefix: str, d_in: int, d_out: int, out_bias: float, gen: torch.Generator) -> Lambda:
    """--head log's MLP: hidden layers He-normal (std sqrt(2 / fan_in)) with zero biases, so standardised inputs reach
    the last hidden layer at unit scale; the output layer's weights are 0, so every client starts at the same output
    (`out_bias`) and any difference between clients has to be learned."""
    out: Lambda = {}
    for wk, bk, b, a, last in _layers(prefix, d_in, d_out):
        out[wk] = (torch.zeros(b, a, device=gen.device) if last
                   else torch.randn(b, a, generator=gen, device=gen.device) * math.sqrt(2.0 / a))
        out[bk] = torch.full((b,), float(out_bias) if last else 0.0, device=gen.device)
    return out


def init_log_lambda(n_bn: int, n_x: int, n_params: int, base_lr: float, nets: str, seed: int,
                    beta_init: float = 0.5) -> Lambda:
    """--head log's lambda: BNNet -> logit(beta), LRNet -> log-multiplier of eta~, and log eta~ ("logeta"), every
    client's strategy at init exactly (beta_init, base_lr)."""
    gen = torch.Generator().manual_seed(seed)
    lam: Lambda = {}
    if nets in ("both", "bnnet"):
        lam |= init_log_mlp("bnnet", n_bn, n_bn, logit(beta_init), gen)
    if nets in ("both", "lrnet"):
        lam |= init_log_mlp("lrnet", n_x, n_params, 0.0, gen)
        lam["logeta"] = torch.full((n_params,), math.log(base_lr), device=gen.device)
    return lam


def log_hyperparameters(lam: Lambda, xi: Tensor, x: Tensor, n_params: int, base_lr: float,
                        fixed_beta: float) -> tuple[Tensor, Tensor]:
    """--head log (not in the paper): beta = sigmoid(BNNet(xi)); eta = exp(log eta~ + R tanh(LRNet(x) / R)),
    R = ln 100. The LR is positive and multiplicative, so a meta-step moves it by a share of itself at any base LR, and
    LRNet's gradient is d L_V / d log eta (not eta~ times d L_V / d eta, ~1e-3 of it); tanh bounds the multiplier
    smoothly (no straight-through runaway past a clamp)."""
    has_bnnet = "bnnet.0.weight" in lam
    beta = torch.sigmoid(mlp.run(mlp.group(lam, "bnnet"), xi)) if has_bnnet else xi.new_full((xi.numel(),), float(fixed_beta))
    if "lrnet.0.weight" in lam:
        raw = mlp.run(mlp.group(lam, "lrnet"), x)
        eta = torch.exp(lam["logeta"] + LOG_LR_RANGE * torch.tanh(raw / LOG_LR_RANGE))
    else:
        eta = x.new_full((n_params,), float(base_lr))
    return beta, eta


def logit(p: float, eps: float = 1e-3) -> float:
    """The sigmoid's inverse, with p kept inside [eps, 1 - eps] (a beta_init of 0 or 1 starts at a finite bias)."""
    p = min(max(p, eps), 1 - eps)
    return math.log(p / (1 - p))


def hyperparameters(lam: Lambda, xi: Tensor, x: Tensor, n_params: int, base_lr: float,
                    fixed_beta: float, eta_nonneg: bool = False,
                    beta_output: BetaOutput = "ste-clamp") -> tuple[Tensor, Tensor]:
    """Eq. 4: beta = BNNet(xi) in [0,1]; eta = LRNet(x) in [0,1000] times eta~ (per parameter tensor). eta~ is a free
    parameter (as in the authors' code), so a tensor's eta can turn negative: gradient *ascent* on it. eta_nonneg
    (not in the paper) clamps eta~ at 0, straight-through, so such a tensor is frozen instead (and counts as sparse).
    beta_output="sigmoid" (not the paper's default) maps BNNet's output through a logistic instead of the clamp."""
    if "bnnet.0.weight" in lam:
        raw = mlp.run(mlp.group(lam, "bnnet"), xi)
        beta = torch.sigmoid(raw) if beta_output == "sigmoid" else clamp_ste(raw, *BETA_RANGE)
    else:
        beta = xi.new_full((xi.numel(),), float(fixed_beta))
    if "lrnet.0.weight" in lam:
        scale = clamp_ste(lam["eta"], 0.0, float("inf")) if eta_nonneg else lam["eta"]
        eta = clamp_ste(mlp.run(mlp.group(lam, "lrnet"), x), *LR_RANGE) * scale
    else:
        eta = x.new_full((n_params,), float(base_lr))
    return beta, eta


def block_of(name: str) -> str:
    return name.split(".")[0]


def sgd_update(lam: Lambda, grads: Lambda, lrs: dict[str, float], clip: float = 1.0) -> Lambda:
    """lambda <- lambda - zeta * clip(g, [-1, 1]), with a learning rate per group."""
    return {k: v - lrs[block_of(k)] * grads[k].clamp(-clip, clip) for k, v in lam.items()}


def grad_report(grads: Lambda, clip: float = 1.0) -> dict[str, Tensor]:
    """Per block (BNNet, LRNet, eta~): L2 norm of the meta-gradient before clipping, and the share of its entries
    that the element-wise clip changes. Shows whether (and where) the meta-nets receive signal. Left on the device
    (0-dim tensors): a round reads its clients' reports at once (`read_values`)."""
    out: dict[str, Tensor] = {}
    for g in GROUPS:
        vals = [v.reshape(-1) for k, v in grads.items() if block_of(k) == g]
        if vals:
            flat = torch.cat(vals)
            out[f"gnorm_{g}"] = flat.norm()
            out[f"clipped_{g}"] = (flat.abs() > clip).float().mean()
    return out


def read_values(values: list[Tensor]) -> list[float]:
    """0-dim tensors as Python floats in one host read (each value exact: float32 and float64 widen to float64)."""
    return torch.stack([v.detach().double() for v in values]).tolist() if values else []


class ServerAdam:
    """FedAdam (Reddi et al., 2021) on lambda: the server treats -(mean client change) as a pseudo-gradient and
    applies Adam with its own step size. Not in the FedL2P paper (whose server takes the plain FedAvg of lambda):
    it is the optional meta-optimizer `--meta-opt fedadam`. Adam normalises each entry's step, so input weights
    whose hypergradients are 1e-4 of the output bias's still move; the moments persist across rounds (they are
    part of the checkpoint)."""

    def __init__(self, lr: float, b1: float = 0.9, b2: float = 0.99, eps: float = 1e-8):
        self.lr, self.b1, self.b2, self.eps = lr, b1, b2, eps

    def step(self, lam: Lambda, averaged: Lambda, state: dict[str, Tensor], t: int) -> tuple[Lambda, dict[str, Tensor]]:
        """t counts server steps from 1. state holds m.<key> and v.<key>; returns the new lambda and state."""
        return adam_step(lam, {k: v - averaged[k] for k, v in lam.items()}, state, t, self.lr, self.b1, self.b2, self.eps)


def adam_step(params: dict[str, Tensor], grads: dict[str, Tensor], state: dict[str, Tensor] | None, t: int, lr: float,
              b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """One Adam step (t counts from 1); state holds m.<key> and v.<key>. Returns the new params and state."""
    state = state or {}
    new, new_state = {}, {}
    for k, v in params.items():
        g = grads[k]
        m = b1 * state.get(f"m.{k}", torch.zeros_like(v)) + (1 - b1) * g
        s = b2 * state.get(f"v.{k}", torch.zeros_like(v)) + (1 - b2) * g * g
        mh, sh = m / (1 - b1 ** t), s / (1 - b2 ** t)
        new[k] = v - lr * mh / (sh.sqrt() + eps)
        new_state[f"m.{k}"], new_state[f"v.{k}"] = m, s
    return new, new_state


def input_normalizer(xi: Tensor, x: Tensor, robust: bool = False) -> dict[str, Tensor]:
    """Per-feature mean and SD over the seen clients' (xi, x), for `--input-norm standardize` (not in the paper:
    xi spans 0.02-1.5 across layers and x spans orders of magnitude, against weights of ~0.01). robust
    (`--input-norm robust`): each SD floored at SD_FLOOR of the feature's scale (mean |value|), so a feature that
    barely varies over the seen pool does not blow an unseen client up, and z clipped to +-Z_CLIP (`z_clip`, stored
    with the rest)."""
    out = {"xi_mean": xi.mean(0), "xi_sd": xi.std(0, unbiased=False).clamp_min(1e-6),
           "x_mean": x.mean(0), "x_sd": x.std(0, unbiased=False).clamp_min(1e-6)}
    if robust:
        for k, v in (("xi", xi), ("x", x)):
            out[f"{k}_sd"] = torch.maximum(out[f"{k}_sd"], SD_FLOOR * v.abs().mean(0))
        out["z_clip"] = xi.new_tensor(Z_CLIP)
    return out


SD_FLOOR, Z_CLIP = 0.05, 3.0  # --input-norm robust: SD >= 5% of the feature's mean |value|; |z| <= 3


def normalize_inputs(norm: dict[str, Tensor] | None, xi: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    if not norm:
        return xi, x
    zi, zx = (xi - norm["xi_mean"]) / norm["xi_sd"], (x - norm["x_mean"]) / norm["x_sd"]
    if "z_clip" in norm:
        c = norm["z_clip"]  # a tensor: no host read
        zi, zx = torch.clamp(zi, -c, c), torch.clamp(zx, -c, c)
    return zi, zx
