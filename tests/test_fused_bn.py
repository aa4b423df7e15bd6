"""The fused fine-tuning path (BN C/G/I layers through F.batch_norm) computes what the general β-mixing path does,
and what a plain nn.BatchNorm training step does for BN I."""

import pytest
import torch
import torch.nn.functional as F

from fedl2p_cli import plugins
from fedl2p_cli.core.bn import BNPolicy, bn_layers, update_running
from fedl2p_cli.core.finetune import ClientBN, Strategy, sgd_step
from fedl2p_cli.core.functional import ce_loss
from fedl2p_cli.models.registry import build

from .helpers import detached_params


def general_step(model, params, x, y, s, bn):
    leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    pol = BNPolicy(s.beta, train=True)  # fused=False: the β-mixing path the hypergradients differentiate
    loss = ce_loss(model, leaves, x, y, pol)
    grads = torch.autograd.grad(loss, list(leaves.values()))
    update_running(bn.mean, bn.var, pol.recorded)
    return {k: v - lr * g for (k, v), lr, g in zip(leaves.items(), s.lr, grads)}


@pytest.fixture(scope="module")
def setup():
    model = build("small-cnn", 1, 10, seed=0, catalog=plugins.current())
    with torch.no_grad():
        for _, m in bn_layers(model):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 1, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)
    return model, detached_params(model), x, y


@pytest.mark.parametrize("beta", ["bnc", "bng", "bni", "mixed", "per-layer"])
def test_fused_step_equals_the_general_path(setup, beta):
    model, theta, x, y = setup
    nb = len(bn_layers(model))
    b = {"bnc": torch.ones(nb), "bng": torch.zeros(nb), "bni": None, "mixed": torch.full((nb,), 0.3),
         "per-layer": torch.tensor([1.0, 0.0, 0.6][:nb])}[beta]
    s = Strategy(b, torch.full((len(theta),), 0.05))
    start = ClientBN([torch.rand(m.num_features) for _, m in bn_layers(model)],
                     [torch.rand(m.num_features) + 0.5 for _, m in bn_layers(model)])
    bn_f, bn_g = start.copy(), start.copy()
    fused, _ = sgd_step(model, theta, x, y, s, bn_f)
    ref = general_step(model, theta, x, y, s, bn_g)
    for k in theta:
        torch.testing.assert_close(fused[k], ref[k], rtol=1e-5, atol=1e-6)
        assert not torch.equal(fused[k], theta[k]) or "running" in k
    for a, c in zip(bn_f.mean + bn_f.var, bn_g.mean + bn_g.var):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)


def test_bn_i_step_equals_plain_pytorch(setup):
    model, theta, x, y = setup
    s = Strategy(None, torch.full((len(theta),), 0.05))
    ours, _ = sgd_step(model, theta, x, y, s, ClientBN([m.running_mean.clone() for _, m in bn_layers(model)],
                                                       [m.running_var.clone() for _, m in bn_layers(model)]))
    plain = build("small-cnn", 1, 10, seed=0, catalog=plugins.current()).train()
    plain.load_state_dict({**plain.state_dict(), **theta})
    opt = torch.optim.SGD(plain.parameters(), lr=0.05)
    F.cross_entropy(plain(x), y).backward()
    opt.step()
    for k, p in plain.named_parameters():
        torch.testing.assert_close(ours[k], p.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(6, 3, 4, 4), (5, 4)])
def test_mixed_batch_norm_backward_and_double_backward_match_finite_differences(shape):
    """MixedBatchNorm's hand-derived backward (first order, reusing the forward's moments) and its double backward
    (recomputing them differentiably), in float64, for x, weight, bias and beta."""
    from fedl2p_cli.core.bn import MixedBatchNorm
    g = torch.Generator().manual_seed(0)
    c = shape[1]
    x = torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(c, generator=g, dtype=torch.float64) + 0.5).requires_grad_(True)
    bias = torch.randn(c, generator=g, dtype=torch.float64, requires_grad=True)
    beta = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    rm, rv = torch.randn(c, generator=g, dtype=torch.float64), torch.rand(c, generator=g, dtype=torch.float64) + 0.5
    f = lambda *a: MixedBatchNorm.apply(*a, rm, rv, 1e-5)[0]  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, w, bias, beta))
    assert torch.autograd.gradgradcheck(f, (x, w, bias, beta))
