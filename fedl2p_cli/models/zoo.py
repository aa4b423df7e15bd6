"""The built-in architectures (registered by fedl2p_cli/builtin.py). Their BN layers are `MixBN` from the start, so
their parameters, buffers and initialisation are exactly those of the artifacts built before models were plugins."""

from __future__ import annotations

from torch import nn

from ..core.bn import MixBN


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


def resnet18_cifar(in_channels: int, num_classes: int) -> nn.Module:
    return resnet18(in_channels, num_classes, cifar=True)


def resnet18_imagenet(in_channels: int, num_classes: int) -> nn.Module:
    return resnet18(in_channels, num_classes, cifar=False)
