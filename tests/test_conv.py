"""core/conv.py's convolution (own backward node, hand-written double backward) against nn.Conv2d's native autograd:
the same values and first, second and third derivatives in float64, and models built with it unchanged."""

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call

from fedl2p_cli import plugins
from fedl2p_cli.core.conv import Conv2d, use_double_backward_convs
from fedl2p_cli.models.registry import build, spec

SHAPES = [dict(padding=1), dict(stride=2, padding=1, bias=True), dict(groups=2, dilation=2, bias=True)]


def pair(kw: dict) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    native = nn.Conv2d(4, 6, 3, **({"bias": False} | kw)).double()
    return native, use_double_backward_convs(nn.Sequential(copy.deepcopy(native)))[0]


def fn(m: nn.Module):
    names = [n for n, _ in m.named_parameters()]
    return lambda x, *p: torch.tanh(functional_call(m, dict(zip(names, p)), (x,)))


def inputs(native: nn.Module) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 4, 9, 9, dtype=torch.float64, generator=g).requires_grad_(True)
    return (x, *[p.detach().clone().requires_grad_(True) for p in native.parameters()])


@pytest.mark.parametrize("kw", SHAPES)
def test_gradcheck_and_gradgradcheck(kw):
    native, ours = pair(kw)
    assert type(ours) is Conv2d
    args = inputs(native)
    assert torch.autograd.gradcheck(fn(ours), args)
    assert torch.autograd.gradgradcheck(fn(ours), args)


def third_derivative(m: nn.Module, args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """d/d(args) of |H u|^2 with H u the Hessian-vector product of sum(f^2): three nested reverse passes."""
    leaves = [a.detach().requires_grad_(True) for a in args]
    g = torch.autograd.grad(fn(m)(*leaves).pow(2).sum(), leaves, create_graph=True)
    hu = torch.autograd.grad(sum((a * a.detach().sin()).sum() for a in g), leaves, create_graph=True)
    return list(torch.autograd.grad(sum((a * a).sum() for a in hu), leaves))


@pytest.mark.parametrize("kw", SHAPES)
def test_values_and_derivatives_up_to_third_order_match_native(kw):
    native, ours = pair(kw)
    args = inputs(native)
    torch.testing.assert_close(fn(ours)(*args), fn(native)(*args), rtol=1e-12, atol=1e-12)
    for a, b in zip(third_derivative(ours, args), third_derivative(native, args)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_built_models_use_it_with_unchanged_parameters_and_rng():
    model = build("resnet18-cifar", 3, 10, seed=0, catalog=plugins.current())
    after = torch.rand(3)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(type(m) is Conv2d for m in convs)
    torch.manual_seed(0)
    plain = spec("resnet18-cifar", plugins.build()).factory(3, 10)  # the factory alone, no conversion: same weights, same RNG after
    assert list(model.state_dict()) == list(plain.state_dict())
    for (k, a), b in zip(model.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(a, b), k
    torch.testing.assert_close(after, torch.rand(3))
