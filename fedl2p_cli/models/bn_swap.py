"""Any nn.Module as the model: every BatchNorm1d/2d (torchvision's, or a user's subclass) becomes our mixing BN
(`core.bn.MixBN`), keeping its module name, parameters and running statistics, so a state dict saved from the user's
own module loads under its own key names. The swap is checked: a copy of the model with random BN statistics and
affine parameters gives the same eval outputs before and after it, to float rounding."""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..core.bn import MixBN, bn_layers
from ..errors import FedL2PError

BN_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d)


def plain_bn(model: nn.Module) -> list[tuple[str, nn.BatchNorm1d | nn.BatchNorm2d]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, BN_TYPES)]


def _mix_bn(name: str, bn: nn.BatchNorm1d | nn.BatchNorm2d) -> MixBN:
    if not (bn.affine and bn.track_running_stats):
        raise FedL2PError(f"BatchNorm layer '{name}' has affine={bn.affine}, track_running_stats={bn.track_running_stats}; "
                          "mixing BN needs both True (a scale and shift, and running statistics to mix)")
    if bn.momentum is None:
        raise FedL2PError(f"BatchNorm layer '{name}' has momentum=None (a cumulative average); give it a number, e.g. 0.1")
    mix = MixBN(bn.num_features, bn.eps, bn.momentum)
    with torch.no_grad():
        for key in ("weight", "bias", "running_mean", "running_var"):
            getattr(mix, key).copy_(getattr(bn, key))
    return mix.to(device=bn.weight.device, dtype=bn.weight.dtype).train(bn.training)


def replace_bn(model: nn.Module) -> nn.Module:
    """Every BatchNorm1d/2d of `model` replaced in place by a MixBN holding its parameters and statistics."""
    for name, bn in plain_bn(model):
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, _mix_bn(name, bn))
    return model


def _randomise_bn(model: nn.Module, gen: torch.Generator) -> None:
    """BN statistics and affine parameters away from their 1/0 defaults, so the check can see a swap that drops one."""
    with torch.no_grad():
        for _, bn in plain_bn(model):
            for key, lo, hi in (("weight", 0.5, 1.5), ("bias", -0.5, 0.5), ("running_mean", -0.5, 0.5),
                                ("running_var", 0.5, 1.5)):
                t = getattr(bn, key)
                t.copy_(torch.rand(t.shape, generator=gen, dtype=t.dtype) * (hi - lo) + lo)


def check_swap(model: nn.Module, example: torch.Tensor, label: str, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Raise unless swapping a copy of `model` (before its swap) keeps its eval outputs on `example`."""
    probe = copy.deepcopy(model).eval()
    _randomise_bn(probe, torch.Generator().manual_seed(0))
    with torch.no_grad():
        try:
            before = probe(example)
        except Exception as e:  # noqa: BLE001 - the user's model does not take this input
            raise FedL2PError(f"model '{label}' fails on an input of shape {tuple(example.shape)}: "
                              f"{e.__class__.__name__}: {e}") from None
        after = replace_bn(probe)(example)
    if not isinstance(before, torch.Tensor) or before.shape != after.shape or not torch.allclose(before, after, rtol, atol):
        diff = (before - after).abs().max().item() if isinstance(before, torch.Tensor) and before.shape == after.shape else "shape"
        raise FedL2PError(f"model '{label}': its outputs change when its BatchNorm layers become mixing BN (max difference "
                          f"{diff}); a BatchNorm subclass with its own forward cannot be mixed")


def require_bn(model: nn.Module, label: str) -> None:
    if not plain_bn(model) and not bn_layers(model):
        raise FedL2PError(f"model '{label}' has no BatchNorm1d/2d layer; FedL2P personalises through BN statistics, so "
                          "the model needs at least one")
