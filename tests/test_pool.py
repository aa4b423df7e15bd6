"""core/pool.py's max-pool (channels-last forward, autograd's own backward formula) against F.max_pool2d: the same
values, indices and first, second and third derivatives bit for bit, also where windows tie (constant regions, as in
images' backgrounds after a ReLU), and built models use it."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedl2p_cli import plugins
from fedl2p_cli.core.pool import MaxPool2d, max_pool2d
from fedl2p_cli.models.registry import build

SHAPES = [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2, stride=1, ceil_mode=True),
          dict(kernel_size=(2, 3), stride=(2, 1), dilation=(1, 2))]


def tied_input(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 3, 11, 12, generator=g)
    x[:, :, :6, :7] = 0.25  # a constant region: every window in it ties
    return x.relu()


def derivatives(pool, x: torch.Tensor, kw: dict) -> list[torch.Tensor]:
    """Values, indices and three nested reverse passes (the IFT's `--hessian exact` differentiates a Hessian-vector
    product once more)."""
    x = x.detach().requires_grad_(True)
    y, idx = pool(x, return_indices=True, **kw)
    w = torch.linspace(-1, 1, y.numel()).view_as(y)
    g, = torch.autograd.grad((y * w).sum() + y.pow(3).sum(), x, create_graph=True)
    hg, = torch.autograd.grad((g * g.detach().cos()).sum() + g.pow(2).sum(), x, create_graph=True)
    third, = torch.autograd.grad(hg.pow(2).sum(), x)
    return [y, idx, g, hg, third]


@pytest.mark.parametrize("kw", SHAPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_values_indices_and_derivatives_equal_native_bit_for_bit(kw, seed):
    x = tied_input(seed)
    ours, native = derivatives(max_pool2d, x, kw), derivatives(F.max_pool2d, x, kw)
    for name, a, b in zip(["values", "indices", "grad", "second", "third"], ours, native):
        assert a.shape == b.shape and a.is_contiguous(), name
        assert torch.equal(a, b), name


def test_gradgradcheck_in_float64():
    x = torch.randn(2, 2, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: max_pool2d(t, 2).pow(2), (x,))
    assert torch.autograd.gradgradcheck(lambda t: max_pool2d(t, 2).pow(2), (x,))


def test_built_models_pool_through_it_with_unchanged_outputs():
    model = build("small-cnn", 1, 10, seed=0, catalog=plugins.current())
    pools = [m for m in model.modules() if isinstance(m, nn.MaxPool2d)]
    assert pools and all(type(m) is MaxPool2d for m in pools)
    x = tied_input(4)[:, :1].expand(4, 1, 11, 12).contiguous()
    native = build("small-cnn", 1, 10, seed=0, catalog=plugins.current())
    for m in native.modules():
        if type(m) is MaxPool2d:
            m.__class__ = nn.MaxPool2d
    assert torch.equal(model.train()(x), native.train()(x))
