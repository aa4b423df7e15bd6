"""Named model factories. Every BatchNorm is a `MixBN`, so all BN strategies share one code path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ..core.bn import MixBN, index_bn_layers
from ..core.conv import use_double_backward_convs
from ..errors import FedL2PError


def small_cnn(in_channels: int, num_classes: int, width: int = 16, act: type[nn.Module] = nn.ReLU,
              pool: type[nn.Module] = nn.MaxPool2d) -> nn.Module:
    """Three conv-BN-act blocks and a linear head: the CPU model of the embedded benchmark."""
    w = [width, 2 * width, 4 * width]

    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), MixBN(cout), act()]

    return nn.Sequential(
        *block(in_channels, w[0]), pool(2),
        *block(w[0], w[1]), pool(2),
        *block(w[1], w[2]), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(w[2], num_classes),
    )


def tiny_smooth(in_channels: int, num_classes: int) -> nn.Module:
    """A smooth (Softplus, AvgPool) model small enough for float64 finite differences and dense Hessians."""
    return nn.Sequential(
        nn.Conv2d(in_channels, 3, 3, padding=1, bias=True), MixBN(3), nn.Softplus(), nn.AvgPool2d(2),
        nn.Conv2d(3, 4, 3, padding=1, bias=False), MixBN(4), nn.Softplus(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(4, num_classes),
    )


def resnet18(in_channels: int, num_classes: int, cifar: bool) -> nn.Module:
    from torchvision.models import resnet18 as tv_resnet18
    m = tv_resnet18(num_classes=num_classes, norm_layer=MixBN)
    if cifar:  # App. D: 3x3 stride-1 first conv, no max-pool
        m.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        m.maxpool = nn.Identity()
    elif in_channels != 3:
        m.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
    return m


@dataclass(frozen=True)
class ModelSpec:
    factory: Callable[[int, int], nn.Module]
    about: str


MODELS: dict[str, ModelSpec] = {
    "small-cnn": ModelSpec(small_cnn, "3 conv-BN-ReLU blocks (16/32/64 ch) + linear; CPU-friendly"),
    "resnet18-cifar": ModelSpec(lambda c, k: resnet18(c, k, cifar=True), "ResNet-18, 3x3 stem, no max-pool (paper, CIFAR)"),
    "resnet18": ModelSpec(lambda c, k: resnet18(c, k, cifar=False), "ResNet-18, ImageNet layout (for --init torchvision weights)"),
    "resnet18-speech": ModelSpec(lambda c, k: resnet18(c, k, cifar=False),
                                 "ResNet-18 for 1-channel log-mel spectrograms, ImageNet stem (paper, Speech Commands; "
                                 "for --spectrogram 128)"),
    "tiny-smooth": ModelSpec(tiny_smooth, "tiny Softplus/AvgPool model for float64 gradient checks"),
}


def head_prefix(model: nn.Module) -> str:
    """Parameter-name prefix of the classifier (the last Linear layer): what FedBABU freezes."""
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise FedL2PError("the model has no linear classifier")
    return names[-1] + "."


def spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise FedL2PError(f"unknown model '{name}'; choose one of: {', '.join(MODELS)}")
    return MODELS[name]


def build(name: str, in_channels: int, num_classes: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return use_double_backward_convs(index_bn_layers(spec(name).factory(in_channels, num_classes)))


def param_names(model: nn.Module) -> list[str]:
    return [n for n, _ in model.named_parameters()]


def get_params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


