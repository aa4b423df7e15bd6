import csv

import pytest
import torch

from fedl2p_cli.algorithms import fedl2p as fedl2p_alg
from fedl2p_cli.core.metanets import clamp_ste, hyperparameters, init_lambda, sgd_update
from fedl2p_cli.engine.loop import Checkpoint
from fedl2p_cli.io import weights
from fedl2p_cli.stages import meta_train, partition, stats

from .conftest import TINY_META
from .helpers import KillAfter, Killed, execute, handed, old_meta


def test_every_metanet_bias_is_the_paper_constant():
    """App. E and the authors' weights_init: every Linear bias (hidden ones too) is 0.5 (BNNet) / 1.0 (LRNet)."""
    lam = init_lambda(20, 82, 62, 1e-3, "both", 0)
    biases = {k: v for k, v in lam.items() if k.endswith(".bias")}
    assert len(biases) == 6
    for k, v in biases.items():
        assert torch.equal(v, torch.full_like(v, 0.5 if k.startswith("bnnet") else 1.0)), k
    zero = init_lambda(20, 82, 62, 1e-3, "both", 0, hidden_bias="zero")
    assert torch.equal(zero["bnnet.0.bias"], torch.zeros(100)) and torch.equal(zero["bnnet.2.bias"], torch.full((20,), 0.5))


def test_initial_outputs_beta_half_lrnet_one():
    """'Resulting in initial values of ~0.5 and ~1.0' (App. E): the mean is on target and no output strays far,
    for any client's inputs; the spread comes from the gain-0.1 output weights over 100 active hidden units."""
    lam = init_lambda(20, 82, 62, 1e-3, "both", 0)
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        xi, x = torch.rand(20, generator=g) * 5, torch.randn(82, generator=g)
        beta, eta = hyperparameters(lam, xi, x, 62, 1e-3, 1.0)
        assert abs(beta.mean().item() - 0.5) < 0.05 and (beta - 0.5).abs().max() < 0.25
        r = eta / 1e-3
        assert abs(r.mean().item() - 1.0) < 0.1 and (r - 1.0).abs().max() < 0.6


def test_straight_through_clamps_pass_gradients():
    x = torch.tensor([-2.0, 0.5, 3.0], requires_grad=True)
    y = clamp_ste(x, 0.0, 1.0)
    assert torch.equal(y.detach(), torch.tensor([0.0, 0.5, 1.0]))
    (g,) = torch.autograd.grad((y * torch.tensor([1.0, 2.0, 3.0])).sum(), x)
    assert torch.equal(g, torch.tensor([1.0, 2.0, 3.0]))


def test_meta_sgd_clips_and_uses_group_rates():
    lam = {"bnnet.0.weight": torch.zeros(2), "lrnet.0.weight": torch.zeros(2), "eta": torch.zeros(2)}
    g = {k: torch.tensor([5.0, -0.5]) for k in lam}
    out = sgd_update(lam, g, {"bnnet": 1e-3, "lrnet": 1e-2, "eta": 1e-4})
    assert torch.allclose(out["bnnet.0.weight"], torch.tensor([-1e-3, 5e-4]))
    assert torch.allclose(out["lrnet.0.weight"], torch.tensor([-1e-2, 5e-3]))
    assert torch.allclose(out["eta"], torch.tensor([-1e-4, 5e-5]))


def test_unseen_clients_never_meta_trained(tiny_store):
    art = tiny_store["meta"]
    _, part = partition.load(tiny_store["store"], tiny_store["partition"].id)
    unseen = set(part.pool(True))
    assert unseen
    with open(art.file("history.csv")) as f:
        rows = list(csv.DictReader(f))
    sampled = {int(c) for r in rows for c in r["sampled"].split()}
    assert sampled and not (sampled & unseen)


def test_meta_resume_equals_uninterrupted(tiny_store, tmp_path):
    store = tiny_store["store"]
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=3, fraction=0.5, meta=TINY_META, seed=1)
    full, _ = execute(meta_train, cfg, store, {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id})
    lam_full = weights.load(full.file("lambda.safetensors"))
    with open(full.file("history.csv")) as f:
        hist_full = list(csv.DictReader(f))
    # interrupt after round 2 through the progress hook, then resume into a fresh build
    cfg2 = meta_train.MetaTrainConfig.preset("fomaml", rounds=3, fraction=0.5, meta=TINY_META, seed=1)

    with pytest.raises(Killed):
        execute(meta_train, cfg2, store,
                {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id}, force=True, progress=KillAfter(2))
    assert Checkpoint(store.workdir("meta-train", full.id)).load().next_round == 2
    resumed, _ = execute(meta_train, cfg2, store, {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id}, force=True)
    lam_res = weights.load(resumed.file("lambda.safetensors"))
    for k in lam_full:
        assert torch.equal(lam_full[k], lam_res[k]), k
    with open(resumed.file("history.csv")) as f:
        hist_res = list(csv.DictReader(f))
    assert [r["val_loss"] for r in hist_full] == [r["val_loss"] for r in hist_res]


def test_divergence_is_reported_and_best_lambda_kept(tiny_store, monkeypatch):
    real = fedl2p_alg.client_update
    calls = {"n": 0}
    from fedl2p_cli.engine.loop import sample_clients
    _, part = partition.load(tiny_store["store"], tiny_store["partition"].id)
    first_round = len(sample_clients(part.pool(False), 0.5, 7, 0))

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] > first_round:  # round 1 is fine, then NaN
            raise fedl2p_alg.Diverged("non-finite loss (val nan)")
        return real(*a, **k)

    monkeypatch.setattr(meta_train, "client_update", flaky)
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=4, fraction=0.5, meta=TINY_META, seed=7)
    art, _ = execute(meta_train, cfg, tiny_store["store"],
                     {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id}, force=True)
    assert "round 2" in art.metrics["diverged"]
    assert art.metrics["rounds_run"] == 1
    with open(art.file("history.csv")) as f:
        rows = list(csv.DictReader(f))  # the diverged round is recorded and marked
    assert [r["round"] for r in rows] == ["1", "2"] and not rows[0]["diverged"] and "val nan" in rows[1]["diverged"]
    assert art.metrics["kept_round"] == 1 and "round 1" in art.metrics["kept"]
    lam = weights.load(art.file("lambda.safetensors"))
    # round 1 scored the only validation loss, so the kept lambda is the one broadcast in round 1: the initial one
    _, table = stats.load(tiny_store["store"], tiny_store["stats"].id)
    lam0 = init_lambda(table.xi.shape[1], table.x.shape[1], len(table.param_names), TINY_META.base_lr, "both", 7)
    assert lam.keys() == lam0.keys() and all(torch.equal(lam[k], lam0[k]) for k in lam0)


def test_a_non_finite_meta_gradient_in_any_tensor_is_caught():
    ok = {"a": torch.ones(3), "b": torch.zeros(2, 2), "c": torch.ones(1)}
    assert fedl2p_alg._finite([ok]) == [True]
    for bad in (float("nan"), float("inf"), -float("inf")):
        grads = dict(ok, b=torch.tensor([[0.0, bad], [0.0, 0.0]]))  # not the first tensor: every one is checked
        assert fedl2p_alg._finite([ok, grads, ok]) == [True, False, True]  # a group's, each client its own


def test_real_nan_in_round_one_keeps_the_initial_lambda(tiny_store):
    """A huge base LR makes fine-tuning blow up in round 1: reported as divergence; the artifact holds the initial
    lambda (the best so far), never NaN, so a pipeline comparing variants goes on."""
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5, seed=3,
                                     meta=old_meta(epochs=2, batch_size=16, base_lr=1e6, meta_grad="ift", beta_init=0.5))
    art, _ = execute(meta_train, cfg, tiny_store["store"], {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id})
    lam = weights.load(art.file("lambda.safetensors"))
    assert "round 1" in art.metrics["diverged"] and art.metrics["rounds_run"] == 0
    _, table = stats.load(tiny_store["store"], tiny_store["stats"].id)
    lam0 = init_lambda(table.xi.shape[1], table.x.shape[1], len(table.param_names), 1e6, "both", 3)
    assert all(torch.equal(lam[k], lam0[k]) for k in lam0)


def test_beta_init_sets_every_bnnet_bias_and_leaves_the_paper_id_unchanged():
    """--beta-init moves BNNet's bias constant (initial beta) and nothing else; at the paper's 0.5 (and the other
    later options at their defaults: --init-gain, --ift-at) the artifact config is the one artifacts had before."""
    from dataclasses import asdict

    from fedl2p_cli.stages.common import config_dict
    lam = init_lambda(20, 82, 62, 1e-3, "both", 0, beta_init=0.9)
    assert all(torch.equal(lam[k], torch.full_like(lam[k], 0.9)) for k in ("bnnet.0.bias", "bnnet.1.bias", "bnnet.2.bias"))
    assert torch.equal(lam["lrnet.2.bias"], init_lambda(20, 82, 62, 1e-3, "both", 0)["lrnet.2.bias"])
    cfg = meta_train.MetaTrainConfig.preset("fomaml", meta=old_meta(meta_grad="ift", beta_init=0.5))  # the paper's
    old = asdict(cfg)
    old["meta"].pop("beta_init")
    old["meta"].pop("init_gain")
    old["meta"].pop("ift_at")
    old["meta"].pop("val_stats")
    old["meta"].pop("eta_nonneg")
    old["meta"].pop("beta_output")
    for k in ("head", "lr_logeta", "lr_grad", "meta_signal"):  # the log head's options (issue 69) and the signal
        old["meta"].pop(k)                                      # (issue 79), out of the id at their reference values
    old.pop("client_weights")
    old.pop("norm_bound"), old.pop("aggregator")  # untrusted-reply options, out of the id at their defaults
    # (workers, engine and the failure policy are the Runtime's, not the config's: never in an id)
    assert config_dict(cfg) == old
    cfg.meta.beta_init = 0.9
    assert config_dict(cfg)["meta"]["beta_init"] == 0.9 and cfg.variant().endswith("-binit0.9")
    cfg.meta.ift_at = "last-step"
    assert config_dict(cfg)["meta"]["ift_at"] == "last-step" and cfg.variant().endswith("-laststep")
    cfg.meta.val_stats = "test-batch"
    assert config_dict(cfg)["meta"]["val_stats"] == "test-batch" and cfg.variant().endswith("-laststep-valtbs")


def test_init_gain_scales_the_weights_and_makes_outputs_depend_on_inputs():
    """--init-gain (not in the paper): every weight's scale follows the gain, biases stay the constants, the paper's
    0.1 keeps old artifact ids, and at gain 1 two clients' inputs give visibly different beta (at 0.1 they do not)."""
    from fedl2p_cli.stages.common import config_dict
    lo, hi = init_lambda(3, 8, 5, 1e-3, "both", 0), init_lambda(3, 8, 5, 1e-3, "both", 0, gain=1.0)
    for k in lo:
        if k.endswith(".weight"):
            torch.testing.assert_close(hi[k], 10 * lo[k])
        else:
            assert torch.equal(hi[k], lo[k]), k
    xi_a, xi_b, x = torch.tensor([0.02, 0.1, 0.3]), torch.tensor([1.5, 1.0, 0.8]), torch.zeros(8)
    spread = {g: (hyperparameters(lam, xi_a, x, 5, 1e-3, 1.0)[0] - hyperparameters(lam, xi_b, x, 5, 1e-3, 1.0)[0]).abs().max()
              for g, lam in (("0.1", lo), ("1", hi))}
    assert spread["0.1"] < 1e-2 < spread["1"]
    cfg = meta_train.MetaTrainConfig.preset("fomaml")
    assert "init_gain" not in config_dict(cfg)["meta"]
    cfg.meta.init_gain = 1.0
    assert config_dict(cfg)["meta"]["init_gain"] == 1.0 and cfg.variant().endswith("-gain1")


def test_ift_last_step_meta_trains_on_the_last_fine_tuning_step(tiny_store):
    """--ift-at last-step runs end to end, moves lambda, and is its own artifact next to the default reading's."""
    meta = old_meta(epochs=2, batch_size=16, base_lr=0.01, ift_at="last-step", meta_grad="ift", beta_init=0.5)
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5, seed=1, meta=meta)
    art, _ = execute(meta_train, cfg, tiny_store["store"], {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id})
    assert art.metrics["variant"] == "fedl2p-laststep-seed1" and art.metrics["rounds_run"] == 2 and not art.metrics["diverged"]
    lam = weights.load(art.file("lambda.safetensors"))
    assert all(torch.isfinite(v).all() for v in lam.values()) and art.id != tiny_store["meta"].id


@pytest.mark.parametrize("meta_grad", ["ift", "fomaml"])
def test_val_stats_test_batch_meta_trains_and_is_its_own_variant(tiny_store, meta_grad):
    """--val-stats test-batch runs end to end for both meta-gradients, with finite losses, under its own name."""
    meta = old_meta(epochs=2, batch_size=16, base_lr=0.01, meta_grad=meta_grad, val_stats="test-batch")
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5, seed=1, meta=meta)
    art, _ = execute(meta_train, cfg, tiny_store["store"], {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id})
    assert art.metrics["variant"].endswith("-valtbs-seed1") and art.metrics["rounds_run"] == 2 and not art.metrics["diverged"]
    lam = weights.load(art.file("lambda.safetensors"))
    assert all(torch.isfinite(v).all() for v in lam.values())


def test_eta_nonneg_freezes_instead_of_ascending():
    """eta~ is unconstrained (the authors' code), so a learned LR can turn negative; --eta-nonneg makes it exactly 0
    (a frozen, sparse tensor) and leaves positive ones alone, while the meta-gradient still reaches eta~."""
    lam = init_lambda(3, 4, 5, 1e-3, "both", 0)
    lam["eta"] = torch.tensor([-2e-3, 1e-3, -1e-4, 2e-3, 5e-4], requires_grad=True)
    xi, x = torch.rand(3), torch.randn(4)
    _, free = hyperparameters(lam, xi, x, 5, 1e-3, 1.0)
    _, pos = hyperparameters(lam, xi, x, 5, 1e-3, 1.0, eta_nonneg=True)
    assert (free[[0, 2]] < 0).all() and torch.equal(pos[[0, 2]].detach(), torch.zeros(2))
    assert torch.equal(pos[[1, 3, 4]], free[[1, 3, 4]])
    (g,) = torch.autograd.grad(pos.sum(), lam["eta"])
    assert (g != 0).all()
    assert meta_train.MetaTrainConfig.preset("fomaml", meta=old_meta(eta_nonneg=True)).variant().endswith("-etapos")


def test_sigmoid_beta_output_starts_at_beta_init_and_its_gradient_fades_where_the_clamp_s_does_not():
    """--beta-output sigmoid: beta = sigmoid(BNNet), the output bias at logit(beta_init); unlike the straight-through
    clamp, whose gradient is 1 however far past the bound the output runs, the sigmoid's is beta (1 - beta)."""
    for b0 in (0.5, 0.9):
        lam = init_lambda(3, 4, 5, 1e-3, "both", 0, beta_init=b0, beta_output="sigmoid")
        assert torch.equal(lam["bnnet.0.bias"], torch.full((100,), b0))  # hidden biases: App. E's constant
        beta, _ = hyperparameters(lam, torch.rand(3), torch.randn(4), 5, 1e-3, 1.0, beta_output="sigmoid")
        assert torch.allclose(beta, torch.full((3,), b0), atol=0.05)  # "~beta_init", as App. E says of the clamp
    lam = init_lambda(3, 4, 5, 1e-3, "both", 0)
    lam["bnnet.2.bias"] = torch.tensor([4.0, 0.0, -4.0], requires_grad=True)  # outputs ~4, ~0, ~-4
    xi, x = torch.rand(3), torch.randn(4)
    (g_ste,) = torch.autograd.grad(hyperparameters(lam, xi, x, 5, 1e-3, 1.0)[0].sum(), lam["bnnet.2.bias"])
    beta, _ = hyperparameters(lam, xi, x, 5, 1e-3, 1.0, beta_output="sigmoid")
    (g_sig,) = torch.autograd.grad(beta.sum(), lam["bnnet.2.bias"])
    assert torch.allclose(g_ste, torch.ones(3))  # straight-through: 1 even at raw 4, far past beta = 1
    assert torch.allclose(g_sig, beta * (1 - beta)) and g_sig[0] < 0.02 and g_sig[1] == pytest.approx(0.25, abs=1e-3)
    assert beta[0] > 0.98 and beta[2] < 0.02
    assert meta_train.MetaTrainConfig.preset("fomaml", meta=old_meta(beta_output="sigmoid")).variant().endswith("-sigmoid")
    named = meta_train.MetaTrainConfig.preset("fomaml", meta=old_meta(beta_output="sigmoid", lr_bnnet=0.004)).variant()
    assert named.endswith("-sigmoid-bnnetlr0.004")  # a meta-LR other than App. E's is named too


def _first_finetune(tiny_store, cfg):
    """A seen client of the tiny store fine-tuned under the initial lambda, as a client update's first iteration."""
    from fedl2p_cli.core.finetune import Strategy, finetune
    store, mcfg = tiny_store["store"], meta_train.MetaTrainConfig.preset("fomaml", meta=cfg)
    ctx = meta_train.make_context(str(store.root), tiny_store["pretrain"].id, tiny_store["partition"].id,
                                  tiny_store["stats"].id, mcfg, handed())
    c = ctx.part.pool(False)[0]
    xi, x = ctx.inputs(c)
    lam = meta_train.initial_lambda(mcfg, ctx.entries.head, len(xi), len(x), len(ctx.theta_g))
    hyper = fedl2p_alg.hyper_fn(xi, x, len(ctx.theta_g), cfg)
    data, gen = ctx.part.client_on(c, torch.device("cpu")), torch.Generator().manual_seed(0)
    with torch.no_grad():
        beta, eta = hyper(lam)
    ft = finetune(ctx.model, ctx.theta_g, *data.train, Strategy(beta, eta), ctx.stats.client_bn(c), cfg.epochs,
                  cfg.batch_size, gen, cfg.client_bn)
    return ctx, lam, hyper, data, ft, beta, eta, gen


def test_stable_ift_neumann_series_converges_on_a_real_client(tiny_store):
    """The cause of eta~'s runaway: on Fashion-MNIST small-cnn clients lambda_max(H_T) is 60-560, so the paper's fixed
    psi = 0.1 gives psi * lambda_max = 6-56 > 2, Alg. 2's series diverges and (Q = 3) flips the sign of the eta~
    hypergradient. The tiny store's model is flatter (lambda_max ~2), so --psi 2 puts it in the same regime. With the
    default series options the psi the IFT uses keeps psi * lambda_max below 2, lambda_max measured here
    independently (30 power iterations from a random start, on the IFT's own train batch)."""
    from fedl2p_cli.core import hypergrad
    from fedl2p_cli.core.functional import random_batch
    cfg = old_meta(epochs=2, batch_size=16, base_lr=0.01, psi=2.0, meta_grad="ift")
    ctx, lam, hyper, data, ft, beta, eta, gen = _first_finetune(tiny_store, cfg)
    mg = fedl2p_alg.meta_gradient(ctx.model, ft, lam, hyper, data, cfg, torch.Generator().manual_seed(1))
    theta = {k: v.detach().requires_grad_(True) for k, v in ft.params.items()}
    (xt, yt), (_, yv), same = data.train, data.val, torch.Generator().manual_seed(1)
    random_batch(len(yv), cfg.batch_size, same)  # the validation batch meta_gradient drew, then its train batch
    ti = random_batch(len(yt), cfg.batch_size, same)
    lt = hypergrad.train_loss(ctx.model, theta, beta, eta, (xt[ti], yt[ti]), cfg.hessian)
    g = torch.autograd.grad(lt, list(theta.values()), create_graph=True)
    hvp = lambda u: hypergrad._grad(g, list(theta.values()), grad_outputs=u, retain_graph=True)  # noqa: E731
    lam_max = power_iteration(hvp, [torch.randn(t.shape, generator=gen) for t in theta.values()], 30)
    assert cfg.psi * lam_max > 2  # a fixed psi diverges on this client
    assert 0 < mg.psi * lam_max < 2, (mg.psi, lam_max)


def power_iteration(hvp, v, iters: int) -> float:
    """|Rayleigh quotient| after `iters` power iterations: a lambda_max independent of core.hypergrad's Krylov code."""
    est = 0.0
    for _ in range(iters):
        n = torch.sqrt(sum((a * a).sum() for a in v))
        v = [a / n for a in v]
        hv = hvp(v)
        est = float(sum((a * b).sum() for a, b in zip(v, hv)))
        v = hv
    return abs(est)


def test_default_client_round_makes_k_times_q_plus_one_second_order_products(tiny_store):
    """The paper's count: K (Q + 1) Hessian-vector and mixed products per client round (here K = 2, Q = 3: 8),
    counted by wrapping torch.autograd.grad (bench/counting.py) around a whole default client update."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from counting import count_backward
    cfg = old_meta(iterations=2, epochs=1, batch_size=16, base_lr=0.01, meta_grad="ift")
    ctx, lam, hyper, data, ft, beta, eta, gen = _first_finetune(tiny_store, cfg)
    c = ctx.part.pool(False)[0]
    with count_backward() as counts:
        fedl2p_alg.client_update(ctx.model, ctx.theta_g, lam, *ctx.inputs(c), ctx.stats.client_bn(c), data, cfg, gen)
    assert counts.second_order == cfg.iterations * (cfg.q + 1), counts


def test_stable_ift_moves_the_learned_lrs_as_the_last_step_says(tiny_store):
    """Why eta~ fell under the converged series: the IFT treats theta* as a stationary point of L_T, which an LR does
    not move, so its LR term is only the bias of an unconverged theta* (on the planted cell it lowered every LR, round
    after round, while the validation loss rose). The default (--eta-grad last-step) takes the learned LRs'
    meta-gradient through the last fine-tuning step, theta* = theta_prev - eta g: on a real client eta~'s is then
    exactly FOMAML+'s (computed independently, by differentiating that step in-graph), which --eta-grad ift's is not."""
    from dataclasses import replace
    cfg = old_meta(epochs=2, batch_size=16, base_lr=0.01, meta_grad="ift")
    ctx, lam, hyper, data, ft, beta, eta, gen = _first_finetune(tiny_store, cfg)

    def eta_grad(c):
        return fedl2p_alg.meta_gradient(ctx.model, ft, lam, hyper, data, c, torch.Generator().manual_seed(1)).grads["eta"]

    unrolled = eta_grad(replace(cfg, meta_grad="fomaml"))  # the same validation batch: drawn first from the same seed
    torch.testing.assert_close(eta_grad(cfg), unrolled, rtol=1e-4, atol=1e-7)
    assert not torch.allclose(eta_grad(replace(cfg, eta_grad="ift")), unrolled, rtol=0.1)


def test_eta_bound_clamps_from_both_sides():
    """Mutation pin (algorithms/fedl2p.py bound_eta): --eta-bound B keeps eta~ within [base LR / B, base LR x B], the
    upper side as much as the lower; the FOMAML+ path leaves eta~ alone."""
    lam = {"eta": torch.tensor([1e-6, 0.01, 5.0, -1.0])}
    cfg = old_meta(meta_grad="ift", eta_bound=10.0, base_lr=0.01)
    assert torch.allclose(fedl2p_alg.bound_eta(lam, cfg)["eta"], torch.tensor([0.001, 0.01, 0.1, 0.001]))
    fomaml = old_meta(meta_grad="fomaml", eta_bound=10.0, base_lr=0.01)
    assert torch.equal(fedl2p_alg.bound_eta(lam, fomaml)["eta"], lam["eta"])
