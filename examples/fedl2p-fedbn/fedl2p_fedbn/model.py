"""The example's model: torchvision's MobileNetV3-small, built with no pretrained weights. It keeps torchvision's own
`nn.BatchNorm2d` layers; fedl2p swaps them for its mixing BN when it builds the model."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class HardSigmoid(nn.Module):
    """relu6(x + 3) / 6: nn.Hardsigmoid's function, written so that autograd can differentiate it twice (FedL2P's
    meta-gradient does; aten's hardsigmoid_backward has no derivative)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.relu6(x + 3) / 6


class HardSwish(HardSigmoid):
    """x * relu6(x + 3) / 6: nn.Hardswish's function, twice differentiable (as HardSigmoid)."""

    def forward(self, x: Tensor) -> Tensor:
        return x * super().forward(x)


def mobilenet_v3_small(in_channels: int, num_classes: int) -> nn.Module:
    """MobileNetV3-small (Howard et al., 2019) for `in_channels`-channel images and `num_classes` classes. Its stem
    takes `in_channels` channels; dropout is 0, so every random draw of a round comes from the round's own seeded
    generator (resume and worker processes stay bit-identical); hard-sigmoid and hard-swish are the same functions
    in twice-differentiable form."""
    from torchvision.models import mobilenet_v3_small as tv

    model = tv(weights=None, num_classes=num_classes, dropout=0.0)
    if in_channels != 3:
        old = model.features[0][0]
        model.features[0][0] = nn.Conv2d(in_channels, old.out_channels, old.kernel_size, old.stride, old.padding,
                                         bias=False)
    for name, m in list(model.named_modules()):
        if isinstance(m, (nn.Hardsigmoid, nn.Hardswish)):
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, HardSwish() if isinstance(m, nn.Hardswish) else HardSigmoid())
    return model
