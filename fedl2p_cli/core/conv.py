"""2-D convolution whose backward is its own autograd node, so that the hypergradient's double backward costs four
convolutions instead of autograd's generic conv double backward.

The backward of y = conv(x, w) is (gx, gw) = B(g, x, w), bilinear in (g, w) and in (g, x). Its derivative, for
incoming gradients (ggx, ggw) of gx and gw:
    d/dg = conv(ggx, w) + conv(x, ggw)        (two forward convolutions)
    d/dx = input-gradient of conv(x, ggw) for output gradient g
    d/dw = weight-gradient of conv(ggx, w) for output gradient g
each one call of a native (mkldnn on CPU) convolution kernel. Measured on this CPU, one thread, batch 32: 0.76x the
time of autograd's own double backward for ResNet-18-cifar's 64-channel 32x32 layer. Every op used is itself
differentiable, so a third derivative (the IFT's `--hessian exact`) still works.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .kernels import custom_allowed

_aten = torch.ops.aten


class _Spec:
    """stride, padding, dilation, groups of one convolution (lists, as aten.convolution_backward takes them)."""

    def __init__(self, m: nn.Conv2d):
        self.stride, self.padding = list(m.stride), cast(list[int], list(m.padding))  # the models pad by numbers
        self.dilation, self.groups = list(m.dilation), m.groups

    def conv(self, x: Tensor, w: Tensor) -> Tensor:
        return F.conv2d(x, w, None, self.stride, self.padding, self.dilation, self.groups)

    def grads(self, g: Tensor, x: Tensor, w: Tensor, want_x: bool, want_w: bool) -> tuple[Tensor | None, Tensor | None]:
        gx, gw, _ = _aten.convolution_backward(g, x, w, None, self.stride, self.padding, self.dilation, False,
                                               [0, 0], self.groups, [want_x, want_w, False])
        return gx, gw


class _ConvGrad(torch.autograd.Function):
    """(g, x, w) -> (gx, gw): the convolution's backward as a node of its own (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, g: Tensor, x: Tensor, w: Tensor, spec: _Spec, want_x: bool,
                want_w: bool) -> tuple[Tensor | None, Tensor | None]:
        ctx.save_for_backward(g, x, w)
        ctx.spec = spec
        ctx.set_materialize_grads(False)
        gx, gw = spec.grads(g, x, w, want_x, want_w)
        return gx, gw

    @staticmethod
    def backward(ctx: Any, ggx: Tensor | None,
                 ggw: Tensor | None) -> tuple[Tensor | None, Tensor | None, Tensor | None, None, None, None]:
        g, x, w = ctx.saved_tensors
        spec, need = ctx.spec, ctx.needs_input_grad
        dg = dx = dw = None
        if need[0]:
            parts = [p for p in (spec.conv(ggx, w) if ggx is not None else None,
                                 spec.conv(x, ggw) if ggw is not None else None) if p is not None]
            dg = parts[0] + parts[1] if len(parts) == 2 else (parts[0] if parts else None)
        if need[1] and ggw is not None:
            dx = spec.grads(g, x, ggw, True, False)[0]
        if need[2] and ggx is not None:
            dw = spec.grads(g, ggx, w, False, True)[1]
        return dg, dx, dw, None, None, None


class _Conv(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, b: Tensor | None, spec: _Spec) -> Tensor:
        ctx.save_for_backward(x, w)
        ctx.spec, ctx.has_bias = spec, b is not None
        y = spec.conv(x, w)
        return y if b is None else y + b.view(1, -1, 1, 1)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None, None]:
        x, w = ctx.saved_tensors
        need = ctx.needs_input_grad
        gx = gw = gb = None
        if need[0] or need[1]:
            gx, gw = _ConvGrad.apply(g, x, w, ctx.spec, need[0], need[1])
        if ctx.has_bias and need[2]:
            gb = g.sum((0, 2, 3))
        return gx, gw, gb, None


class Conv2d(nn.Conv2d):
    """nn.Conv2d (same parameters, state-dict keys and initialisation) computed through `_Conv`."""

    def _conv_forward(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        if self.padding_mode != "zeros" or isinstance(self.padding, str) or not custom_allowed():
            return cast(Tensor, super()._conv_forward(x, weight, bias))  # torch leaves its return unannotated
        return cast(Tensor, _Conv.apply(x, weight, bias, _Spec(self)))


def use_double_backward_convs(model: nn.Module) -> nn.Module:
    """Turn every plain nn.Conv2d of `model` into `Conv2d` in place. The class is swapped rather than the module
    rebuilt, so parameters, their order and the global RNG state (no re-initialisation) stay exactly as they were."""
    for m in model.modules():
        if type(m) is nn.Conv2d:
            m.__class__ = Conv2d
    return model
