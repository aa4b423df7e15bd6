"""pFedLA's layer-wise personalised aggregation (Ma et al., CVPR 2022, Eq. 3-11) as pure functions.

The server keeps every client's latest model (stacked: name -> [N, ...]) and, per client i, a hypernetwork
HN_i(v_i; psi_i): embedding v_i -> 3-layer ReLU MLP -> one head per layer giving alpha_i^l, a distribution over
the N clients (softmax: non-negative, sums to 1; the paper leaves the squashing to its supplement). Client i
receives theta_bar_i^l = sum_j alpha_i^{l,j} theta_j^l (Eq. 6), trains, and returns delta_i = theta_i - theta_bar_i;
the hypernetwork then takes the step of Eq. 10-11 with delta_i standing for minus the loss gradient, so that
theta_bar_i moves *towards* theta_i.

A "layer" is a module: the parameters that share a name prefix (conv weight and bias, BN weight and bias). BN
running statistics are the client's own: never mixed (they describe its data, they are not learned weights).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from . import mlp

Hyper = dict[str, Tensor]
Stacked = dict[str, Tensor]   # name -> [N, *shape]: every client's stored tensor


def layer_of(name: str) -> str:
    return name.rsplit(".", 1)[0]


def layers_of(param_names: list[str]) -> list[str]:
    return list(dict.fromkeys(layer_of(n) for n in param_names))


def _linear(out: Hyper, key: str, d_in: int, d_out: int, gen: torch.Generator) -> None:
    bound = 1.0 / math.sqrt(d_in)  # nn.Linear's default range
    out[f"{key}.weight"] = (torch.rand(d_out, d_in, generator=gen, device=gen.device) * 2 - 1) * bound
    out[f"{key}.bias"] = (torch.rand(d_out, generator=gen, device=gen.device) * 2 - 1) * bound


def init_hypernet(n_clients: int, layers: list[str], embed_dim: int, hidden: int, gen: torch.Generator) -> Hyper:
    """One client's hypernetwork: embedding ~ N(0, 1) (nn.Embedding's init), MLP embed -> hidden -> hidden -> hidden,
    one linear head hidden -> N per layer."""
    hn: Hyper = {"embedding": torch.randn(embed_dim, generator=gen, device=gen.device)}
    for i, (a, b) in enumerate(zip([embed_dim, hidden, hidden], [hidden] * 3)):
        _linear(hn, f"mlp.{i}", a, b, gen)
    for layer in layers:
        _linear(hn, f"head.{layer}", hidden, n_clients, gen)
    return hn


def alphas(hn: Hyper, layers: list[str]) -> dict[str, Tensor]:
    """Eq. 4: alpha_i = HN_i(v_i; psi_i), one [N] distribution per layer."""
    h = mlp.run(mlp.group(hn, "mlp"), hn["embedding"], final_relu=True)
    return {l: torch.softmax(torch.nn.functional.linear(h, hn[f"head.{l}.weight"], hn[f"head.{l}.bias"]), 0) for l in layers}


def retained_layers(alpha: dict[str, Tensor], client: int, k: int) -> list[str]:
    """HeurpFedLA (Eq. 12): the k layers with the largest self-weight alpha_i^{l,i}; they stay local."""
    if k <= 0:
        return []
    order = sorted(alpha, key=lambda l: -float(alpha[l][client]))
    return order[:k]


def mix(stacked: Stacked, alpha: dict[str, Tensor], client: int, param_names: list[str],
        retained: Sequence[str] = ()) -> dict[str, Tensor]:
    """Eq. 5-6 for client `client`: every parameter mixed layer-wise over the clients; a retained layer and
    every buffer (BN running statistics) are the client's own stored tensor."""
    out = {}
    for name, t in stacked.items():
        layer = layer_of(name)
        if name in param_names and layer not in retained:
            a = alpha[layer].to(t.dtype)
            out[name] = torch.tensordot(a, t, dims=([0], [0]))
        else:
            out[name] = t[client]
    return out


def hypernet_step(hn: Hyper, stacked: Stacked, client: int, param_names: list[str], layers: list[str],
                  delta: dict[str, Tensor], lr: float, retained: Sequence[str] = ()) -> Hyper:
    """Eq. 10-11: psi_i <- psi_i + lr (d theta_bar_i / d psi_i)^T delta_i (and the same for v_i).
    delta_i = theta_i - theta_bar_i is a descent direction of the client's loss at theta_bar_i, so this is a
    gradient step on that loss through the mix: it moves theta_bar_i towards theta_i. Retained layers
    contribute nothing (their mix does not depend on HN_i)."""
    leaves = {k: v.detach().requires_grad_(True) for k, v in hn.items()}
    bar = mix(stacked, alphas(leaves, layers), client, param_names, retained)
    names = [n for n in param_names if layer_of(n) not in retained]
    if not names:
        return {k: v.detach().clone() for k, v in hn.items()}
    grads = torch.autograd.grad([bar[n] for n in names], list(leaves.values()),
                                grad_outputs=[-delta[n].to(bar[n].dtype) for n in names], allow_unused=True)
    return {k: (v - lr * g).detach() if g is not None else v.detach().clone()
            for (k, v), g in zip(leaves.items(), grads)}


def stack(states: list[dict[str, Tensor]]) -> Stacked:
    return {k: torch.stack([s[k] for s in states]) for k in states[0]}
