"""Server-side aggregation: FedAvg of tensor dicts weighted by sample counts."""

from __future__ import annotations

import torch
from torch import Tensor


def weighted_average(states: list[dict[str, Tensor]], weights: list[float]) -> dict[str, Tensor]:
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
