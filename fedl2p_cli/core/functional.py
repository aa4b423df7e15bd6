"""Functional model calls over `dict[str, Tensor]` parameters (torch.func style)."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from .bn import BNPolicy, policy

Params = dict[str, Tensor]


def forward(model: nn.Module, params: Params, x: Tensor, pol: BNPolicy | None = None) -> Tensor:
    with policy(pol):
        return cast(Tensor, functional_call(model, params, (x,)))


def ce_loss(model: nn.Module, params: Params, x: Tensor, y: Tensor, pol: BNPolicy | None = None) -> Tensor:
    return F.cross_entropy(forward(model, params, x, pol), y)


def _on(idx: Tensor, device: torch.device | None) -> Tensor:
    # batch order is always drawn on the CPU generator (a GPU run sees a CPU run's batches); the indices then go to
    # the data's device without a host sync (a pageable copy is staged at once, nothing waits for the GPU)
    return idx if device is None else idx.to(device, non_blocking=True)


def _epoch(n: int, batch_size: int, gen: torch.Generator) -> list[Tensor]:
    perm = torch.randperm(n, generator=gen, device=gen.device)
    out = list(perm.split(batch_size))  # type: ignore[no-untyped-call]  # torch leaves Tensor.split unannotated
    if len(out) > 1 and len(out[-1]) < 2:  # a lone last sample joins the batch before it (pop first, then index)
        last = out.pop()
        out[-1] = torch.cat([out[-1], last])
    return out


def shuffled_batches(n: int, batch_size: int, gen: torch.Generator, device: torch.device | None = None) -> list[Tensor]:
    """One epoch of index batches; the last partial batch is kept unless it has a single sample (BN)."""
    return epochs_of_batches(n, batch_size, gen, 1, device)


def epochs_of_batches(n: int, batch_size: int, gen: torch.Generator, epochs: int,
                      device: torch.device | None = None) -> list[Tensor]:
    """`epochs` epochs of `shuffled_batches`, drawn in the same order from `gen` and moved to `device` in one copy."""
    batches = [b for _ in range(epochs) for b in _epoch(n, batch_size, gen)]
    if device is None or device == batches[0].device:
        return batches
    return list(_on(torch.cat(batches), device).split([len(b) for b in batches]))  # type: ignore[no-untyped-call]


def mean_loss(losses: list[Tensor]) -> float:
    """The steps' mean loss, read from the device once (summed in order in float64, as per-step Python floats were)."""
    return sum(torch.stack(losses).tolist()) / len(losses) if losses else 0.0


def random_batch(n: int, batch_size: int, gen: torch.Generator, device: torch.device | None = None) -> Tensor:
    return _on(torch.randperm(n, generator=gen, device=gen.device)[:batch_size], device)


def evaluate(model: nn.Module, params: Params, x: Tensor, y: Tensor, pol: BNPolicy | None = None,
             batch_size: int = 512) -> tuple[float, float]:
    """Mean cross-entropy and accuracy; `batch_size` matters only when the policy uses batch statistics."""
    total_loss, correct = evaluate_sums(model, params, x, y, pol, batch_size)
    n = max(len(y), 1)
    return total_loss.item() / n, correct.item() / n


@torch.no_grad()
def evaluate_sums(model: nn.Module, params: Params, x: Tensor, y: Tensor, pol: BNPolicy | None = None,
                  batch_size: int = 512) -> tuple[Tensor, Tensor]:
    """`evaluate`'s summed cross-entropy (float64) and count of correct answers, left on the device (no host read)."""
    total_loss, correct = x.new_zeros((), dtype=torch.float64), y.new_zeros((), dtype=torch.int64)  # read once, at the end
    for i in range(0, len(y), batch_size):
        xb, yb = x[i:i + batch_size], y[i:i + batch_size]
        if len(yb) < 2 and pol is not None and pol.client_mean is None and i > 0:
            xb, yb = x[i - 1:i + 1], y[i - 1:i + 1]  # batch statistics need two samples
            logits = forward(model, params, xb, pol)[-1:]
            yb = yb[-1:]
        else:
            logits = forward(model, params, xb, pol)
        loss, right = logit_sums(logits, yb)
        total_loss += loss
        correct += right
    return total_loss, correct


def logit_sums(logits: Tensor, y: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """A batch's summed cross-entropy (float64: as Python floats were) and count of correct answers; `mask` (bool): a
    padded batch's own samples (a vmapped group, `core.batched.scores_many`)."""
    right = logits.argmax(1) == y
    if mask is None:
        return F.cross_entropy(logits, y, reduction="sum").double(), right.sum()
    per = F.cross_entropy(logits, y, reduction="none").double()
    return torch.where(mask, per, 0.0).sum(), (right & mask).sum()


def get_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers (the running statistics), detached copies."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def set_state(model: nn.Module, state: dict[str, torch.Tensor]) -> nn.Module:
    """Copy `state` (every key of the model's state dict) into the model's parameters and buffers; the model."""
    with torch.no_grad():
        for k, v in model.state_dict().items():
            v.copy_(state[k])
    return model


def global_accuracy(model: nn.Module, state: dict, x: Tensor, y: Tensor) -> float:
    """The model's accuracy on (x, y) under `state`, unadapted (NaN on no samples): a pretrained model's own score."""
    if len(y) == 0:
        return float("nan")
    return int(global_correct(model, state, x, y)) / len(y)  # one host read


@torch.no_grad()
def global_correct(model: nn.Module, state: dict, x: Tensor, y: Tensor) -> Tensor:
    """How many of (x, y) the model under `state` (its own BN statistics, eval mode) gets right, on the device."""
    set_state(model, state).eval()
    return sum(((model(x[i:i + 1024]).argmax(1) == y[i:i + 1024]).sum() for i in range(0, len(y), 1024)),
               torch.zeros((), dtype=torch.int64, device=y.device))
