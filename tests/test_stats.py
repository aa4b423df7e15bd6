import math

import torch

from fedl2p_cli import plugins
from fedl2p_cli.core.bn import MixBN
from fedl2p_cli.core.stats import Moments, client_stats, kl_gauss, layer_statistics, stat_layers, sym_kl
from fedl2p_cli.models.registry import build


def test_kl_closed_form_and_zero():
    mu_p, vp, mu_q, vq = torch.tensor([1.0]), torch.tensor([4.0]), torch.tensor([0.0]), torch.tensor([1.0])
    expect = math.log(1 / 2) + (4 + 1) / 2 - 0.5
    assert torch.allclose(kl_gauss(mu_p, vp, mu_q, vq), torch.tensor([expect]))
    m, v = torch.randn(5), torch.rand(5) + 0.1
    assert sym_kl(m, v, m, v).abs() < 1e-7
    # symmetric KL of N(1, 4) and N(0, 1) (+1e-5 on the variances)
    a, b = 4 + 1e-5, 1 + 1e-5
    sym = 0.5 * (0.5 * (math.log(b / a) + (a + 1) / b - 1) + 0.5 * (math.log(a / b) + (b + 1) / a - 1))
    assert abs(sym_kl(mu_p, vp, mu_q, vq).item() - sym) < 1e-6


def test_batched_merge_equals_single_pass():
    x = torch.randn(1000, 3, 4, 4, dtype=torch.float64) * 3 + 5
    parts = [Moments.of(c, [0, 2, 3]) for c in x.split(77)]
    m = parts[0]
    for p in parts[1:]:
        m = m.merge(p)
    assert torch.allclose(m.mean, x.mean(dim=(0, 2, 3)))
    assert torch.allclose(m.var, x.var(dim=(0, 2, 3), unbiased=False))
    pooled = m.pooled()
    assert torch.allclose(pooled.mean, x.mean()) and torch.allclose(pooled.var, x.var(unbiased=False))


def test_layer_order_equals_module_order_and_batch_size_invariance():
    model = build("small-cnn", 1, 10, catalog=plugins.current())
    seen = []
    hs = [m.register_forward_pre_hook(lambda mod, i, n=n: seen.append(n)) for n, m in stat_layers(model)]
    model.eval()(torch.randn(2, 1, 32, 32))
    for h in hs:
        h.remove()
    assert seen == [n for n, _ in stat_layers(model)]
    assert len(seen) == 7  # 3 conv + 3 BN + 1 linear
    x = torch.randn(300, 1, 32, 32)
    a, b = layer_statistics(model, x, 300), layer_statistics(model, x, 64)
    for p, q in zip(a[0], b[0]):
        assert torch.allclose(p.mean, q.mean, atol=1e-5) and torch.allclose(p.var, q.var, rtol=1e-4)


def test_resnet18_cifar_has_82_inputs():
    model = build("resnet18-cifar", 3, 10, catalog=plugins.current())
    assert len(stat_layers(model)) == 41


def test_client_matching_pretrained_statistics_gets_zero_xi():
    model = build("small-cnn", 1, 10, catalog=plugins.current())
    x = torch.randn(512, 1, 32, 32)
    # set every BN layer's running statistics to the exact statistics of its input on x
    _, bn = layer_statistics(model, x)
    for m, mo in zip([m for m in model.modules() if isinstance(m, MixBN)], bn):
        m.running_mean.copy_(mo.mean.float())
        m.running_var.copy_(mo.var.float())
    # layer statistics after a BN change affect later layers: iterate to the fixed point
    for _ in range(3):
        _, bn = layer_statistics(model, x)
        for m, mo in zip([m for m in model.modules() if isinstance(m, MixBN)], bn):
            m.running_mean.copy_(mo.mean.float())
            m.running_var.copy_(mo.var.float())
    st = client_stats(model, x)
    assert st.xi.abs().max() < 1e-4
    shifted = client_stats(model, x * 3 + 1)
    assert shifted.xi.min() > 0.1


def test_corrupted_domains_get_larger_xi(tiny_store):
    from fedl2p_cli.stages import stats
    _, t = stats.load(tiny_store["store"], tiny_store["stats"].id)
    xi = t.xi.mean(1)
    # the tiny model is pretrained on all three domains, so its BN statistics are a mixture; contrast (domain 2)
    # shrinks the spread far from it while clean sits close
    clean, contrast = xi[torch.from_numpy(t.domain == 0)].mean(), xi[torch.from_numpy(t.domain == 2)].mean()
    assert contrast > 2 * clean


def test_grouped_clients_equal_one_at_a_time():
    from fedl2p_cli.core.stats import many_client_stats
    model = build("small-cnn", 1, 10, catalog=plugins.current())
    xs = [torch.randn(40, 1, 32, 32) * (1 + i) + i for i in range(5)] + [torch.randn(30, 1, 32, 32)]
    many = many_client_stats(model, xs, batch_size=128)
    for x, got in zip(xs, many):
        one = client_stats(model, x)
        assert torch.allclose(got.x, one.x, rtol=1e-4, atol=1e-5)
        assert torch.allclose(got.xi, one.xi, rtol=1e-4, atol=1e-5)
        for a, b in zip(got.bn_var, one.bn_var):
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
