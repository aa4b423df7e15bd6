"""core.autodiff: torch.autograd's transforms (`AUTOGRAD`, one client) give torch.func's (`FUNC`, what a group vmaps)
values, nested as the meta-gradients nest them (a gradient of a gradient, a vjp of a gradient called many times)."""

import pytest
import torch

from fedl2p_cli.core.autodiff import AUTOGRAD, FUNC


@pytest.fixture(autouse=True)
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def meta_objective(d, lam, theta, x):
    """FOMAML's shape: one inner gradient step under lam, its loss differentiated w.r.t. lam."""
    def outer(lm):
        inner = lambda th: ((th["w"] * x).sin().sum() * lm["a"]) ** 2  # noqa: E731
        g, val = d.grad_and_value(inner)(theta)
        stepped = {k: v - lm["eta"] * g[k] for k, v in theta.items()}
        return (stepped["w"] * x).cos().sum() * lm["a"], val
    return d.grad(outer, has_aux=True)(lam)


def hessian_products(d, lam, theta, x, u):
    """The IFT's shape: a vjp of a gradient, called twice, one primal at a time and both."""
    loss = lambda th, lm: ((th["w"] * x).sin() * lm["a"]).pow(3).sum()  # noqa: E731
    _, products, value = d.vjp(lambda th, lm: d.grad_and_value(loss)(th, lm), theta, lam, has_aux=True)
    return products({"w": u}, only=0)[0], products({"w": u}, only=1)[1], products({"w": 2 * u}), value


def test_autograd_transforms_equal_torch_func():
    g = torch.Generator().manual_seed(0)
    theta = {"w": torch.randn(5, generator=g)}
    lam = {"a": torch.tensor(0.7), "eta": torch.tensor(0.3)}
    x, u = torch.randn(5, generator=g), torch.randn(5, generator=g)
    (ga, va), (gf, vf) = meta_objective(AUTOGRAD, lam, theta, x), meta_objective(FUNC, lam, theta, x)
    assert all(torch.allclose(ga[k], gf[k]) for k in lam) and torch.allclose(va, vf)
    assert ga["eta"].abs() > 0  # the inner gradient's graph reached the outer transform
    for a, f in zip(hessian_products(AUTOGRAD, lam, theta, x, u), hessian_products(FUNC, lam, theta, x, u)):
        flat_a = a if isinstance(a, tuple) else (a,)
        flat_f = f if isinstance(f, tuple) else (f,)
        for pa, pf in zip(flat_a, flat_f):
            for k in pf if isinstance(pf, dict) else [None]:
                ta, tf = (pa[k], pf[k]) if k is not None else (pa, pf)
                assert torch.allclose(ta, tf), k


def test_only_one_primal_is_computed_when_asked():
    theta, lam = {"w": torch.ones(3)}, {"a": torch.tensor(2.0)}
    _, products = AUTOGRAD.vjp(lambda th, lm: {"w": th["w"] * lm["a"]}, theta, lam)
    assert products({"w": torch.ones(3)}, only=0)[1] is None
    assert torch.equal(products({"w": torch.ones(3)}, only=1)[1]["a"], torch.tensor(3.0))
