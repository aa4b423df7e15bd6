"""The shortest plugin for fedl2p: one model. `pip install -e .`, then `fedl2p pretrain --model wide-cnn`."""

from fedl2p_cli import api

FEDL2P_API = 1  # the fedl2p_cli.api version this plugin is written for


def wide_cnn(in_channels: int, num_classes: int):
    """Two conv-BN-ReLU blocks (their BatchNorm layers become fedl2p's mixing BN) and a linear classifier."""
    from torch import nn  # imported when the model is built, so that `fedl2p --help` stays quick
    return nn.Sequential(nn.Conv2d(in_channels, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes))


def register(registry: api.Registry) -> None:
    registry.add_model("wide-cnn", wide_cnn, "two conv-BN-ReLU blocks of 32 and 64 channels (fedl2p-wide-cnn)")
