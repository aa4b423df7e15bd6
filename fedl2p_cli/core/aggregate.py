"""Server-side aggregation: FedAvg of tensor dicts weighted by sample counts, the robust rules, and the equal-norm
mean of the clients' changes."""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor


def weighted_average(states: list[dict[str, Tensor]], weights: list[float]) -> dict[str, Tensor]:
    """The key-wise mean of `states` weighted by `weights` (a client's sample count: FedAvg's rule)."""
    if not states:
        raise ValueError("nothing to aggregate")
    total = float(sum(weights))
    out = {}
    for k, ref in states[0].items():
        if not torch.is_floating_point(ref):  # counters and other integer buffers: keep the first
            out[k] = ref.clone()
            continue
        acc = torch.zeros_like(ref, dtype=torch.float64)
        for s, w in zip(states, weights):
            acc += s[k].to(torch.float64) * (w / total)
        out[k] = acc.to(ref.dtype)
    return out


def reject_reason(sent: dict[str, Tensor], got: dict[str, Tensor], n: int, n_max: int | None) -> str | None:
    """Why a client's reply cannot be aggregated, or None: the tensors sent out come back, each with its shape and
    dtype, all finite, with a claimed sample count in [1, n_max] (n_max: the client's known train size, if any)."""
    if set(got) != set(sent):
        missing, extra = sorted(set(sent) - set(got)), sorted(set(got) - set(sent))
        return f"tensors {'missing ' + missing[0] if missing else 'unexpected ' + extra[0]}"
    for k, ref in sent.items():
        t = got[k]
        if not isinstance(t, Tensor) or t.shape != ref.shape or t.dtype != ref.dtype:
            return (f"{k} is {getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}, expected "
                    f"{ref.dtype} {tuple(ref.shape)}")
        if not bool(torch.isfinite(t).all()):
            return f"{k} is not finite"
    if not isinstance(n, int) or n < 1 or (n_max is not None and n > n_max):
        return f"claims {n} samples (expected 1..{n_max})"
    return None


def update_norms(sent: dict[str, Tensor], updates: list[dict[str, Tensor]]) -> list[float]:
    """||lambda_i - lambda_sent|| of each client, over all tensors (float64)."""
    return [float(torch.sqrt(cast(Tensor, sum(((u[k].double() - v.double()) ** 2).sum() for k, v in sent.items()))))
            for u in updates]


def robust_average(states: list[dict[str, Tensor]], weights: list[float], rule: str, trim: float = 0.2) -> dict[str, Tensor]:
    """`mean`: FedAvg (the paper). `median`: the coordinate-wise median (the lower one of an even count);
    `trimmed-mean`: the coordinate-wise mean of what is left after dropping the `trim` share at each end
    (Yin et al. 2018; both unweighted, not in the paper)."""
    if rule == "mean":
        return weighted_average(states, weights)
    out = {}
    for k in states[0]:
        stack = torch.stack([s[k].to(torch.float64) for s in states])
        if rule == "median":
            out[k] = stack.median(0).values.to(states[0][k].dtype)
            continue
        cut = int(trim * len(states))
        kept = stack.sort(0).values[cut:len(states) - cut]
        out[k] = kept.mean(0).to(states[0][k].dtype)
    return out


def equal_norm_average(sent: dict[str, Tensor], states: list[dict[str, Tensor]], weights: list[float],
                       per_tensor: bool = False) -> dict[str, Tensor]:
    """sent + the weighted mean of the clients' changes, each rescaled to the round's median change norm: every client
    moves lambda by the same amount, so a client whose change is ten times smaller (a low-loss kind: a smaller
    gradient) pulls as hard as the others, and the round's step stays the size of a typical client's. A client that
    did not move counts with its zero change. `per_tensor`: the same for each tensor of lambda on its own (a client's
    pull on log eta~ is as strong as on BNNet's weights, whatever their share of its change)."""
    if per_tensor:
        return {k: equal_norm_average({k: v}, [{k: s[k]} for s in states], weights)[k] for k, v in sent.items()}
    norms = update_norms(sent, states)
    target = float(torch.tensor(norms, dtype=torch.float64).quantile(0.5))  # an even count: the two middles' mean
    scale = [target / n if n > 0 else 0.0 for n in norms]
    base = {k: v.to(torch.float64) for k, v in sent.items()}
    moved = [{k: v + (s[k].to(torch.float64) - v) * c for k, v in base.items()} for s, c in zip(states, scale)]
    return {k: v.to(sent[k].dtype) for k, v in weighted_average(moved, weights).items()}
