"""pFedLA / HeurpFedLA and CAFeMe: the maths against hand computations, gating, partitions, and the stage end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedl2p_cli import plugins
from fedl2p_cli.algorithms import cafeme
from fedl2p_cli.core import layer_mix as lm
from fedl2p_cli.core.modulate import gate_sites, gated, init_modulator, modulator
from fedl2p_cli.data import corruptions as corr
from fedl2p_cli.data.partition import shards_partition
from fedl2p_cli.models import registry
from fedl2p_cli.stages import personalize, pfl

from .helpers import execute

NAMES = ["a.weight", "a.bias", "b.weight"]


def tiny_server(n: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    states = [{"a.weight": torch.randn(2, 3, generator=g, dtype=torch.float64), "a.bias": torch.randn(2, generator=g, dtype=torch.float64),
               "b.weight": torch.randn(4, generator=g, dtype=torch.float64),
               "b.running_mean": torch.randn(4, generator=g, dtype=torch.float64)}
              for _ in range(n)]
    layers = lm.layers_of(NAMES)
    hn = {k: v.double() for k, v in lm.init_hypernet(n, layers, 5, 7, g).items()}
    return lm.stack(states), hn, layers


def test_mix_is_eq6_and_buffers_stay_the_clients_own():
    stacked, hn, layers = tiny_server()
    alpha = lm.alphas(hn, layers)
    for a in alpha.values():
        assert (a > 0).all() and torch.allclose(a.sum(), torch.tensor(1.0, dtype=a.dtype))
    bar = lm.mix(stacked, alpha, 1, NAMES)
    want = sum(alpha["a"][j] * stacked["a.weight"][j] for j in range(3))
    assert torch.allclose(bar["a.weight"], want)
    assert torch.equal(bar["b.running_mean"], stacked["b.running_mean"][1])


def test_hypernetwork_step_equals_a_hand_computation_and_moves_the_mix_towards_the_trained_model():
    """Eq. 10-11 with delta as the output gradient. By hand: theta_bar^l = sum_j softmax(z^l)_j theta_j^l, so
    d theta_bar^l / d z_j^l = alpha_j (theta_j^l - theta_bar^l); the head bias moves by lr alpha_j <theta_j - bar, delta>."""
    stacked, hn, layers = tiny_server()
    i, lr = 0, 0.05
    alpha = lm.alphas(hn, layers)
    bar = lm.mix(stacked, alpha, i, NAMES)
    g = torch.Generator().manual_seed(5)
    delta = {n: torch.randn(bar[n].shape, generator=g, dtype=torch.float64) for n in NAMES}
    new = lm.hypernet_step(hn, stacked, i, NAMES, layers, delta, lr)
    for layer in layers:
        members = [n for n in NAMES if lm.layer_of(n) == layer]
        hand = torch.stack([alpha[layer][j] * sum(((stacked[n][j] - bar[n]) * delta[n]).sum() for n in members)
                            for j in range(3)])
        assert torch.allclose(new[f"head.{layer}.bias"] - hn[f"head.{layer}.bias"], lr * hand, atol=1e-12)
    moved = lm.mix(stacked, lm.alphas(new, layers), i, NAMES)
    # the sign: the new mix is closer to theta_i = bar + delta (a backwards step would move it away)
    assert sum(((moved[n] - bar[n]) * delta[n]).sum() for n in NAMES) > 0
    before = sum(((bar[n] + delta[n] - bar[n]) ** 2).sum() for n in NAMES)
    after = sum(((bar[n] + delta[n] - moved[n]) ** 2).sum() for n in NAMES)
    assert after < before


def test_heurpfedla_keeps_exactly_the_top_k_self_weighted_layers_local():
    stacked, hn, layers = tiny_server(n=3)
    hn["head.a.bias"] = torch.tensor([5.0, 0.0, 0.0], dtype=torch.float64)  # client 0's self-weight on 'a' is largest
    hn["head.b.bias"] = torch.tensor([-5.0, 0.0, 0.0], dtype=torch.float64)
    hn["head.a.weight"] = hn["head.a.weight"] * 0
    hn["head.b.weight"] = hn["head.b.weight"] * 0
    alpha = lm.alphas(hn, layers)
    assert lm.retained_layers(alpha, 0, 1) == ["a"]
    assert lm.retained_layers(alpha, 0, 2) == ["a", "b"] and lm.retained_layers(alpha, 0, 0) == []
    bar = lm.mix(stacked, alpha, 0, NAMES, ["a"])
    assert torch.equal(bar["a.weight"], stacked["a.weight"][0]) and torch.equal(bar["a.bias"], stacked["a.bias"][0])
    assert not torch.equal(bar["b.weight"], stacked["b.weight"][0])
    delta = {n: torch.ones_like(bar[n]) for n in NAMES}
    new = lm.hypernet_step(hn, stacked, 0, NAMES, layers, delta, 0.1, ["a"])
    assert torch.equal(new["head.a.bias"], hn["head.a.bias"]) and torch.equal(new["head.a.weight"], hn["head.a.weight"])
    assert not torch.equal(new["head.b.bias"], hn["head.b.bias"])


@pytest.mark.parametrize("name,sites", [("small-cnn", [16, 32, 64]), ("resnet18-cifar", [64] * 2 + [128] * 2 + [256] * 2 + [512] * 2)])
def test_gate_sites(name, sites):
    model = registry.build(name, 1, 10, catalog=plugins.current())
    assert [c for _, c in gate_sites(model, 1)] == sites


def test_gates_are_in_01_and_gates_of_one_reproduce_the_base_model_exactly():
    model = registry.build("small-cnn", 1, 10, catalog=plugins.current()).eval()
    sites = gate_sites(model, 1)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 1, 32, 32, generator=g), torch.randint(0, 10, (6,), generator=g)
    zeta = modulator(init_modulator(1, 10, sum(c for _, c in sites), g), x, y, 10)
    assert zeta.shape == (112,) and ((torch.sigmoid(zeta) > 0) & (torch.sigmoid(zeta) < 1)).all()
    with torch.no_grad():
        base = model(x)
        with gated(model, sites, torch.full((112,), 100.0)):  # sigmoid(100) == 1 in float32
            ones = model(x)
        with gated(model, sites, zeta):
            modulated = model(x)
    assert torch.equal(base, ones) and not torch.allclose(base, modulated)
    assert torch.equal(model(x), base)  # the hooks are gone afterwards


def test_cafeme_modulator_context_is_permutation_invariant():
    g = torch.Generator().manual_seed(1)
    mod = init_modulator(1, 10, 12, g)
    x, y = torch.randn(8, 1, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)
    p = torch.randperm(8, generator=g)
    assert torch.allclose(modulator(mod, x, y, 10), modulator(mod, x[p], y[p], 10), atol=1e-6)


def test_cafeme_second_order_meta_gradient_matches_finite_differences():
    """order="second" differentiates through the inner SGD steps: check d(held-out loss)/d(one base weight)
    against central differences of the same unrolled computation, in float64 on the smooth model."""
    model = registry.build("tiny-smooth", 1, 3, catalog=plugins.current()).double()
    sites = gate_sites(model, 1, 8)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 1, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (12,), generator=g)
    xv, yv = torch.randn(6, 1, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (6,), generator=g)
    mu = {k: v.double() for k, v in init_modulator(1, 3, sum(c for _, c in sites), g).items()}
    omega = cafeme.join(mu, {n: p.detach().clone() for n, p in model.named_parameters()})
    cfg = cafeme.CAFeMeConfig(steps=2, inner_lr=0.1, outer_lr=1.0, batch_size=12, order="second", outer="sgd",
                               num_classes=3)

    def held_out_loss(om):
        om = {k: v.clone().requires_grad_(True) for k, v in om.items()}
        _, psi, zeta = cafeme.adapt(model, sites, om, x, y, cfg.steps, cfg, torch.Generator().manual_seed(3), create_graph=True)
        return float(cafeme.loss(model, sites, psi, xv, yv, zeta).detach())

    new, _, _ = cafeme.client_update(model, sites, omega, (x, y), (xv, yv), cfg, torch.Generator().manual_seed(3))
    key, eps = "psi.4.weight", 1e-6
    for idx in [(0, 0, 1, 1), (2, 1, 0, 2)]:
        up, down = dict(omega), dict(omega)
        up[key], down[key] = omega[key].clone(), omega[key].clone()
        up[key][idx] += eps
        down[key][idx] -= eps
        fd = (held_out_loss(up) - held_out_loss(down)) / (2 * eps)
        grad = float(omega[key][idx] - new[key][idx])  # outer_lr 1, plain SGD: the step is the gradient
        assert abs(grad - fd) < 1e-6 * max(1.0, abs(fd)), (idx, grad, fd)


def test_shards_give_each_client_k_classes_in_equal_amounts():
    labels = np.repeat(np.arange(10), 100)
    splits = shards_partition(labels, [np.arange(1000)], [10], 60, 4, 0.2, 0.2, seed=0)
    for s in splits:
        counts = np.bincount(labels[s.indices()], minlength=10)
        assert sorted(counts[counts > 0].tolist()) == [15, 15, 15, 15]
    assert len(np.unique(np.concatenate([s.indices() for s in splits]))) == 600  # no sample given twice


def test_rotation_domains():
    x = torch.zeros(1, 1, 8, 8, dtype=torch.uint8)
    x[0, 0, 0, :] = 255
    assert torch.equal(corr.apply("rotate0", x, 3, 0), x)
    r = corr.apply("rotate90", x, 3, 0)
    assert r[0, 0, :, 0].sum() > 1000 and r[0, 0, 0, 1:].sum() < 255  # the top row became the left column
    assert corr.rotation("rotate37.5") == 37.5 and corr.rotation("rotateX") is None


def test_pfl_train_and_personalize_in_one_table(tiny_store):
    store = tiny_store["store"]
    part = tiny_store["partition"]
    a, _ = execute(pfl, pfl.PFLConfig(algo="heurpfedla", rounds=2, local_epochs=1, batch_size=16, lr=0.01, eval_every=1), store,
                   {"partition": part.id})
    b, _ = execute(pfl, pfl.PFLConfig(algo="cafeme", rounds=2, fraction=0.5, batch_size=16, lr=0.05, eval_every=1), store,
                   {"partition": part.id})
    assert a.metrics["server_state_bytes"] > 0 and np.isfinite(b.metrics["val_acc"])
    cfg = personalize.PersonalizeConfig(methods=["ft-bnc", "heurpfedla", "cafeme"], epochs=1, batch_size=16, base_lr=0.01,
                                        seeds=[0], pfl_steps=3)
    art, _ = execute(personalize, cfg, store, {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id})
    _, r = personalize.load(store, art.id)
    # one order whatever the order given (issue 51): hand-made in registry order, then the others by name
    assert r.methods == ["ft-bnc", "cafeme", "heurpfedla"] and not np.isnan(r.acc_after).any()
    assert art.parents["pfl:heurpfedla"] == a.id and art.parents["pfl:cafeme"] == b.id
    cfg.unseen = True
    art, _ = execute(personalize, cfg, store, {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id})
    _, r = personalize.load(store, art.id)
    assert np.isnan(r.acc_after[2]).all() and not np.isnan(r.acc_after[1]).any()  # pFedLA: no model for unseen clients
    assert "| HeurpFedLA | N/A |" in art.file("summary.md").read_text()


def test_pfl_resume_is_bit_identical(tiny_store):
    """Killed after round 2 of 3, then re-run: the same bytes as an uninterrupted run (Adam moments included)."""
    from fedl2p_cli.engine.loop import Checkpoint

    from .helpers import KillAfter, Killed
    store, part = tiny_store["store"], tiny_store["partition"]
    for algo, name in (("pfedla", "server.safetensors"), ("cafeme", "omega.safetensors")):
        cfg = pfl.PFLConfig(algo=algo, rounds=3, fraction=0.5, local_epochs=1, batch_size=16, lr=0.02, eval_every=2,
                            outer="adam", seed=1)
        full, _ = execute(pfl, cfg, store, {"partition": part.id})
        want = full.file(name).read_bytes()
        with pytest.raises(Killed):
            execute(pfl, cfg, store, {"partition": part.id}, force=True, progress=KillAfter(2))
        assert Checkpoint(store.workdir("pfl", full.id)).load().next_round == 2
        again, _ = execute(pfl, cfg, store, {"partition": part.id}, force=True)
        assert again.file(name).read_bytes() == want, algo


def test_cafeme_runs_on_resnet18_cifar():
    """The gates sit after each residual block of ResNet-18-cifar; one meta-update is finite and changes omega."""
    model = registry.build("resnet18-cifar", 3, 10, catalog=plugins.current())
    sites = gate_sites(model, 3)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 3, 32, 32, generator=g), torch.randint(0, 10, (6,), generator=g)
    mu = init_modulator(3, 10, sum(c for _, c in sites), g)
    omega = cafeme.join(mu, {n: p.detach().clone() for n, p in model.named_parameters()})
    cfg = cafeme.CAFeMeConfig(steps=1, batch_size=4, num_classes=10)
    new, loss, moments = cafeme.client_update(model, sites, omega, (x, y), (x[:3], y[:3]), cfg, g)
    assert np.isfinite(loss) and moments is not None
    assert any(not torch.equal(new[k], omega[k]) for k in omega if k.startswith("mu."))
    assert any(not torch.equal(new[k], omega[k]) for k in omega if k.startswith("psi."))
