"""2-D max pooling whose forward runs torch's channels-last kernel.

On CPU, torch's max-pool forward for NCHW tensors is several times slower than for channels-last ones (one thread,
batch 32: 2.6 ms against 0.9 ms for 16 x 32 x 32 maps, copies included), while its backward is fastest with every
tensor NCHW (with a channels-last input and an NCHW gradient it is 4x slower than either). So the forward pools a
channels-last copy and returns NCHW values and indices, and the backward is autograd's own formula on NCHW tensors.
Both kernels take the first maximum of each window in the same scan order: the values, indices, gradients and
second derivatives are those of F.max_pool2d, bit for bit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .kernels import custom_allowed

_aten = torch.ops.aten


class _MaxPool(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, kernel: list[int], stride: list[int], padding: list[int], dilation: list[int],
                ceil_mode: bool) -> tuple[Tensor, Tensor]:
        y, idx = _aten.max_pool2d_with_indices(x.contiguous(memory_format=torch.channels_last), kernel, stride,
                                               padding, dilation, ceil_mode)
        idx = idx.contiguous()
        ctx.save_for_backward(x, idx)
        ctx.args = kernel, stride, padding, dilation, ceil_mode
        ctx.mark_non_differentiable(idx)
        return y.contiguous(), idx

    @staticmethod
    def backward(ctx: Any, g: Tensor, _g_idx: Tensor | None) -> tuple[Tensor, None, None, None, None, None]:
        x, idx = ctx.saved_tensors
        # a differentiable op: under create_graph its derivative (a gather by idx) is autograd's, as for F.max_pool2d
        return _aten.max_pool2d_with_indices_backward(g, x, *ctx.args, idx), None, None, None, None, None


def _pair(v: int | Sequence[int]) -> list[int]:
    return [v, v] if isinstance(v, int) else list(v)


@overload
def max_pool2d(x: Tensor, kernel_size: int | Sequence[int], stride: int | Sequence[int] | None = None,
               padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, ceil_mode: bool = False,
               return_indices: Literal[False] = False) -> Tensor: ...
@overload
def max_pool2d(x: Tensor, kernel_size: int | Sequence[int], stride: int | Sequence[int] | None = None,
               padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]: ...
def max_pool2d(x: Tensor, kernel_size: int | Sequence[int], stride: int | Sequence[int] | None = None,
               padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """F.max_pool2d with the forward on the channels-last kernel, for a batched NCHW CPU tensor."""
    if x.dim() != 4 or x.device.type != "cpu" or not x.is_contiguous() or not custom_allowed():
        return F.max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode,  # type: ignore[call-overload,no-any-return]
                            return_indices)
    stride = kernel_size if stride is None or stride == [] else stride
    y, idx = _MaxPool.apply(x, _pair(kernel_size), _pair(stride), _pair(padding), _pair(dilation), ceil_mode)
    return (y, idx) if return_indices else y


class MaxPool2d(nn.MaxPool2d):
    """nn.MaxPool2d (same arguments, no parameters) computed through `max_pool2d`."""

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        return max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                          self.return_indices)


def use_channels_last_pools(model: nn.Module) -> nn.Module:
    """Turn every plain nn.MaxPool2d of `model` into `MaxPool2d` in place (the class swapped, as for convolutions)."""
    for m in model.modules():
        if type(m) is nn.MaxPool2d:
            m.__class__ = MaxPool2d
    return model
