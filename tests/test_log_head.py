"""The log head (--head log) and the LRs' trajectory meta-gradient (--lr-grad trajectory): every client starts at the
same strategy, a split between clients can be learned, the LR gradient sees the whole fine-tuning (checked against
finite differences), and the robust input standardisation, the per-kind split and equal client weights."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from fedl2p_cli.algorithms import meta_grads
from fedl2p_cli.algorithms.fedl2p import hyper_fn
from fedl2p_cli.analysis import spread
from fedl2p_cli.core.client import ClientData
from fedl2p_cli.core.finetune import Strategy, eval_policy, finetune
from fedl2p_cli.core.functional import ce_loss
from fedl2p_cli.core.metanets import (
    LOG_LR_RANGE,
    Z_CLIP,
    init_lambda,
    init_log_lambda,
    input_normalizer,
    log_hyperparameters,
    normalize_inputs,
)
from fedl2p_cli.core.settings import MetaConfig

from .helpers import execute, handed, smooth_setup


def test_the_log_head_starts_every_client_at_the_same_strategy():
    """Zero output layers: beta_init and the base LR exactly, whatever the inputs (the paper's head at gain 1 does
    not: its split at init is noise of the draw)."""
    lam = init_log_lambda(3, 14, 10, 1e-3, "both", seed=5, beta_init=0.3)
    outs = [log_hyperparameters(lam, torch.randn(3) * 3, torch.randn(14) * 3, 10, 1e-3, 1.0) for _ in range(4)]
    for beta, eta in outs:
        assert torch.allclose(beta, torch.full((3,), 0.3), atol=1e-6)
        assert torch.allclose(eta, torch.full((10,), 1e-3), rtol=1e-6)
    paper = init_lambda(3, 14, 10, 1e-3, "both", seed=5, gain=1.0)
    from fedl2p_cli.core.metanets import hyperparameters
    betas = [hyperparameters(paper, torch.randn(3) * 3, torch.randn(14) * 3, 10, 1e-3, 1.0)[0] for _ in range(4)]
    assert max(float((a - b).abs().max()) for a in betas for b in betas) > 0.01


def test_a_split_between_clients_can_be_learned_from_the_zero_start():
    """At init the outputs ignore the inputs, yet the gradient of the gap between two clients' beta and log LR
    is not 0: a meta-step can open a split (hidden layers pass the inputs on)."""
    lam = {k: v.requires_grad_(True) for k, v in init_log_lambda(3, 14, 10, 1e-3, "both", seed=0).items()}
    xa, xb = (torch.randn(3), torch.randn(14)), (torch.randn(3), torch.randn(14))
    (ba, ea), (bb, eb) = (log_hyperparameters(lam, *x, 10, 1e-3, 1.0) for x in (xa, xb))
    gap = (ba - bb).sum() + (ea.log() - eb.log()).sum()
    assert float(gap.detach().abs()) < 1e-6
    grads = torch.autograd.grad(gap, [lam["bnnet.2.weight"], lam["lrnet.2.weight"]])
    assert all(float(g.abs().max()) > 1e-3 for g in grads)


def test_the_log_heads_lr_is_positive_and_bounded():
    """exp of a tanh-bounded log multiplier: within eta~ / 100 .. eta~ x 100 even for a runaway raw output."""
    lam = init_log_lambda(3, 14, 10, 1e-3, "both", seed=0)
    lam["lrnet.2.bias"] = torch.linspace(-1e3, 1e3, 10)
    _, eta = log_hyperparameters(lam, torch.zeros(3), torch.zeros(14), 10, 1e-3, 1.0)
    assert float(eta.min()) >= 1e-3 * math.exp(-LOG_LR_RANGE) * 0.999
    assert float(eta.max()) <= 1e-3 * math.exp(LOG_LR_RANGE) * 1.001


def _val_loss(model, params, s, bn, xv, yv) -> float:
    with torch.no_grad():
        return float(ce_loss(model, params, xv, yv, eval_policy(s, bn)))


@dataclasses.dataclass
class LogClient:
    """A smooth float64 client at the log head's initial lambda (every input 0), fine-tuned 2 epochs of 3 steps."""
    model: torch.nn.Module
    theta: dict
    lam: dict
    hyper: object
    data: ClientData
    bn0: object
    cfg: MetaConfig

    @classmethod
    def make(cls, lr_grad: str) -> LogClient:
        model, theta, _, _, (x, y), bn0 = smooth_setup(n=48)
        n_p = len(theta)
        cfg = MetaConfig(head="log", lr_grad=lr_grad, meta_grad="fomaml", epochs=2, batch_size=16, base_lr=0.05,
                         beta_init=0.5)
        xi, xs = torch.zeros(len(bn0.mean), dtype=torch.float64), torch.zeros(2 * n_p, dtype=torch.float64)
        lam = {k: v.double() for k, v in init_log_lambda(len(bn0.mean), 2 * n_p, n_p, cfg.base_lr, "both", 0).items()}
        return cls(model, theta, lam, hyper_fn(xi, xs, n_p, cfg), ClientData((x, y), (x[:16], y[:16]), (x[:4], y[:4])),
                   bn0, cfg)

    def tune(self, scale: float) -> tuple[Strategy, object]:
        with torch.no_grad():
            beta, eta = self.hyper(self.lam)
        s = Strategy(beta, eta * scale)
        x, y = self.data.train
        return s, finetune(self.model, self.theta, x, y, s, self.bn0, self.cfg.epochs, self.cfg.batch_size,
                           torch.Generator().manual_seed(3), self.cfg.client_bn)

    def slope(self, lr_grad: str, ft) -> float:
        """d L_V / d log s from the code path meta-train runs: log eta~'s FOMAML+ meta-gradient, summed."""
        cfg = dataclasses.replace(self.cfg, lr_grad=lr_grad)
        mg = meta_grads.builtin("fomaml", lr_grad).one(self.model, ft, self.lam, self.hyper, self.data, cfg,
                                                      torch.Generator().manual_seed(4))
        return float(mg.grads["logeta"].sum())


def test_the_trajectory_lr_gradient_matches_finite_differences_over_the_whole_fine_tuning():
    """dL_V / d log s for a common LR scale s, on a smooth float64 model fine-tuned for 6 steps: the meta-gradient
    of log eta~ under --lr-grad trajectory (the code path meta-train runs) against central differences of the whole
    fine-tuning (same batches; the client's BN statistics held, as the estimate holds them). The last-step path is
    about 1/steps of it; the trajectory estimate is within x1.5."""
    c = LogClient.make("trajectory")
    s, ft = c.tune(1.0)
    h = 1e-3
    fd = (_val_loss(c.model, c.tune(math.exp(h))[1].params, s, ft.bn, *c.data.val)
          - _val_loss(c.model, c.tune(math.exp(-h))[1].params, s, ft.bn, *c.data.val)) / (2 * h)
    est, est_last = c.slope("trajectory", ft), c.slope("last-step", ft)
    assert abs(fd) > 1e-3
    assert 1 / 1.5 < est / fd < 1.5, (est, fd)
    assert abs(est_last / fd) < 0.5, (est_last, fd)  # the last of 6 steps: a fraction of the slope
    # beta's meta-gradient does not depend on the LR path
    g = torch.Generator
    traj = meta_grads.builtin("fomaml", "trajectory").one(c.model, ft, c.lam, c.hyper, c.data, c.cfg, g().manual_seed(4))
    last = meta_grads.builtin("fomaml").one(c.model, ft, c.lam, c.hyper, c.data, c.cfg, g().manual_seed(4))
    assert torch.allclose(traj.grads["bnnet.2.bias"], last.grads["bnnet.2.bias"])


def test_the_trajectory_bn_lr_gradient_matches_finite_differences_with_the_statistics_recomputed():
    """--lr-grad trajectory-bn: the same slope, with the client's BN statistics recomputed after each fine-tuning
    (PreciseBN, as evaluation does) on both sides: the estimate differentiates through them, and lands within x1.5 of
    central differences."""
    c = LogClient.make("trajectory-bn")

    def loss_at(scale: float) -> float:
        s, ft = c.tune(scale)
        return _val_loss(c.model, ft.params, s, ft.bn, *c.data.val)  # its own recomputed statistics

    h = 1e-3
    fd = (loss_at(math.exp(h)) - loss_at(math.exp(-h))) / (2 * h)
    est = c.slope("trajectory-bn", c.tune(1.0)[1])
    assert 1 / 1.5 < est / fd < 1.5, (est, fd)


def test_the_bn_path_slope_is_the_derivative_through_recomputed_statistics():
    """`lr_slope_bn` per tensor against an oracle: central differences of L_V(theta* - t d_k) with the client's
    statistics recomputed by `precise_bn` (no autograd) at every t, d_k the tensor's summed gradient. The slope with
    the statistics held (the trajectory estimate's) misses that path and fails the same check."""
    from fedl2p_cli.core.finetune import precise_bn
    from fedl2p_cli.core.hypergrad import lr_slope_bn
    model, theta, _, _, (x, y), _ = smooth_setup(n=48, seed=2)
    beta = torch.tensor([0.3, 0.8], dtype=torch.float64)[: len(_bn_layers(model))]
    g = torch.Generator().manual_seed(0)
    dirs = [torch.randn(v.shape, generator=g, dtype=v.dtype) for v in theta.values()]
    val = (x[:16], y[:16])
    slope = lr_slope_bn(model, theta, beta, val, x, dirs)
    s = Strategy(beta, torch.zeros(len(theta), dtype=torch.float64))
    fixed = precise_bn(model, theta, x, beta)
    th = {k: v.clone().requires_grad_(True) for k, v in theta.items()}
    v = torch.autograd.grad(ce_loss(model, th, *val, eval_policy(s, fixed)), list(th.values()))
    held = torch.stack([-(a * d).sum() for a, d in zip(v, dirs)])

    def loss(k: int, t: float) -> float:
        moved = {n: v - t * d if i == k else v for i, ((n, v), d) in enumerate(zip(theta.items(), dirs))}
        return _val_loss(model, moved, s, precise_bn(model, moved, x, beta), *val)

    h = 1e-5
    for k in range(len(theta)):
        fd = (loss(k, h) - loss(k, -h)) / (2 * h)  # theta = theta_g - eta d: dL/deta_k = -dL/dtheta_k . d_k
        assert float(slope[k]) == pytest.approx(fd, rel=1e-4, abs=1e-8), k
    assert not torch.allclose(slope, held, rtol=1e-3)


def _bn_layers(model):
    from fedl2p_cli.core.bn import bn_layers
    return bn_layers(model)


def test_robust_standardisation_floors_the_sd_and_clips_z():
    """A feature that is constant over the seen pool gets an SD of 5% of its scale, not 1e-6; an unseen client far
    out reaches |z| = 3, not thousands."""
    xi = torch.tensor([[1.0, 0.2], [1.0, 0.4], [1.0, 0.6]])
    x = torch.tensor([[10.0], [12.0], [14.0]])
    plain, robust = input_normalizer(xi, x), input_normalizer(xi, x, robust=True)
    far = (torch.tensor([1.5, 0.4]), torch.tensor([200.0]))
    zi, zx = normalize_inputs(plain, *far)
    assert float(zi[0]) > 1e4
    zi, zx = normalize_inputs(robust, *far)
    assert float(robust["xi_sd"][0]) == pytest.approx(0.05)
    assert float(zi[0]) == Z_CLIP and float(zx[0]) == Z_CLIP and float(zi[1]) == pytest.approx(0.0)


def test_the_split_by_kind_counts_frozen_tensors_and_reads_the_round_0_control():
    """Per kind: mean beta per layer and LR multiplier; the split between kinds over the tensors every kind trains,
    and the frozen tensors counted, not dropped."""
    beta = np.array([[0.1, 0.5], [0.1, 0.5], [0.9, 0.5]])
    eta = np.array([[1e-3, 0.0, 2e-3], [1e-3, 1e-3, 2e-3], [4e-3, 1e-3, 2e-3]])
    out = spread.by_kind(beta, eta, np.array([0, 0, 1]), ["clean", "invert"], 1e-3)
    assert out["split_beta"] == pytest.approx(0.8)
    assert out["split_lr"] == pytest.approx(4.0)
    assert out["frozen"] == 1
    assert out["lrx_invert"] == pytest.approx((4 + 1 + 2) / 3)
    same = spread.by_kind(beta[:, :1] * 0 + 0.5, eta * 0 + 1e-3, np.array([0, 0, 1]), ["clean", "invert"], 1e-3)
    assert same["split_beta"] == 0.0 and same["split_lr"] == 1.0 and same["frozen"] == 0


def test_meta_train_under_the_log_head_records_its_round_0_control(tiny_store, tmp_path):
    """A meta-train artifact's metrics hold the split by kind at round 0 (the initial lambda: exactly 0 under the
    log head) beside the kept lambda's; history.csv has the per-kind LR multipliers per round; equal client
    weights and robust inputs name the variant."""
    import shutil

    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.stages import meta_train

    from .conftest import TINY_META
    root = tmp_path / "s"
    shutil.copytree(tiny_store["store"].root, root)
    meta = dataclasses.replace(TINY_META, head="log", lr_grad="trajectory", meta_grad="fomaml", lr_bnnet=0.05,
                               lr_lrnet=0.05)
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5, meta=meta, input_norm="robust", client_weights="equal",
                                     keep="last")
    art, _ = execute(meta_train, cfg, Store(root), {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id})
    assert art.metrics["variant"] == "fedl2p-learn-traj-bnnetlr0.05-lrnetlr0.05"
    split = art.metrics["split"]
    assert split["round 0"]["split_beta"] == 0.0 and split["round 0"]["split_lr"] == 1.0
    assert split["kept"]["split_beta"] > 0.0 and split["kept"]["split_lr"] > 1.0
    header = art.file("history.csv").read_text().splitlines()[0].split(",")
    assert {"lrx_clean", "lrx_invert", "split_beta", "split_lr", "frozen"} <= set(header)


def test_a_head_and_a_server_step_are_one_registration_each(tiny_store, tmp_path):
    """A plugin's meta-net head (the log head with beta pinned) and server step (FedAvg that halves the move) are
    chosen by --head and --meta-opt through the catalog, like the built-ins: their runs go through both client-update
    paths (one at a time and batched) and the server, the variant names carry their names, and an unknown name is one
    line naming the choices."""
    import shutil

    from fedl2p_cli import plugins
    from fedl2p_cli.algorithms.heads import LogHead
    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.catalog import META_HEAD
    from fedl2p_cli.errors import FedL2PError
    from fedl2p_cli.io import weights
    from fedl2p_cli.runtime import Runtime
    from fedl2p_cli.stages import meta_train
    from fedl2p_cli.stages.interface import Inputs, StageContext, run_stage

    from .conftest import TINY_META
    calls = []

    @dataclasses.dataclass(frozen=True)
    class Pinned:
        name: str = "pinned-beta"
        about: str = "a test's head: the log head with every beta at 0.5"

        def init(self, *args):
            calls.append("init")
            return LogHead().init(*args)

        def hyperparameters(self, lam, xi, x, n_params, cfg):
            calls.append("hyper")
            beta, eta = LogHead().hyperparameters(lam, xi, x, n_params, cfg)
            return torch.full_like(beta, 0.5), eta

    @dataclasses.dataclass(frozen=True)
    class HalfStep:
        name: str = "half-step"
        about: str = "a test's server step: half of the combined move"

        def step(self, lam, combined, state, t, lr):
            calls.append("step")
            return {k: v + 0.5 * (combined[k] - v) for k, v in lam.items()}, state

    shutil.copytree(tiny_store["store"].root, tmp_path / "s")
    store = Store(tmp_path / "s")
    ids = tiny_store["pretrain"].id, tiny_store["stats"].id
    meta = dataclasses.replace(TINY_META, meta_grad="fomaml", head="pinned-beta")
    mine = meta_train.MetaTrainConfig.preset("fomaml", rounds=1, fraction=0.5, keep="last", meta=meta, meta_opt="half-step")
    assert mine.variant() == "fedl2p-fomaml-half-step-last-pinned-beta"
    catalog = plugins.build(lambda r: (r.add_meta_head(Pinned()), r.add_server_step(HalfStep())))
    inputs = Inputs.given({"pretrain": ids[0], "stats": ids[1]})
    one, _ = run_stage(meta_train, mine, inputs, StageContext(store, Runtime(catalog=catalog)))
    many, _ = run_stage(meta_train, mine, inputs, StageContext(store, Runtime(engine="batched", client_batch=4,
                                                                             catalog=catalog), force=True))
    assert {"init", "hyper", "step"} <= set(calls) and one.id == many.id
    assert plugins.current().find(META_HEAD, "pinned-beta") is None
    lam = weights.load(one.file("lambda.safetensors"))
    assert "logeta" in lam and one.manifest.get("plugins")
    with pytest.raises(FedL2PError, match="unknown meta-net head 'pinned-beta' \\(--head\\); choose one of: paper, log"):
        run_stage(meta_train, mine, inputs, StageContext(store, handed(), force=True))


@dataclasses.dataclass(frozen=True)
class Doubled:
    """A test's LR meta-gradient: the whole fine-tuning's path, twice over (every LR slope doubled)."""
    name: str = "doubled"
    about: str = "a test's LR path: the trajectory's, x2"
    calls: list = dataclasses.field(default_factory=list, compare=False)

    def path(self, ft):
        self.calls.append("path")
        return [2 * g for g in ft.grad_sum]

    def slope(self, model, ft, beta, val, x_train, val_stats):
        return None


def test_an_lr_meta_gradient_is_one_registration(tiny_store, tmp_path):
    """A plugin's --lr-grad entry reaches the meta-gradient through the catalog like the built-ins: the stage's
    meta-gradient takes its path (log eta~'s and LRNet's meta-gradients double against `trajectory`'s, beta's stay),
    meta-train runs it one client at a time and batched to the same artifact, the variant name carries its name, and a
    meta-gradient that takes no LR path refuses any entry but last-step in one line."""
    import shutil

    from fedl2p_cli import plugins
    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.core.config import ConfigError
    from fedl2p_cli.runtime import Runtime
    from fedl2p_cli.stages import meta_train
    from fedl2p_cli.stages.interface import Inputs, StageContext, run_stage

    from .conftest import TINY_META
    entry = Doubled()
    catalog = plugins.build(lambda r: r.add_lr_grad(entry))
    c = LogClient.make("doubled")
    _, ft = c.tune(1.0)
    mine = meta_train.meta_gradient_of(c.cfg, catalog)
    traj = meta_grads.builtin("fomaml", "trajectory")
    g = [m.one(c.model, ft, c.lam, c.hyper, c.data, c.cfg, torch.Generator().manual_seed(4)).grads for m in (mine, traj)]
    assert torch.allclose(g[0]["logeta"], 2 * g[1]["logeta"]) and float(g[1]["logeta"].abs().max()) > 1e-6
    assert torch.allclose(g[0]["bnnet.2.bias"], g[1]["bnnet.2.bias"])

    shutil.copytree(tiny_store["store"].root, tmp_path / "s")
    store = Store(tmp_path / "s")
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=1, fraction=0.5, keep="last",
                                     meta=dataclasses.replace(TINY_META, meta_grad="fomaml", head="log", lr_grad="doubled"))
    assert "doubled" in cfg.variant().split("-")
    inputs = Inputs.given({"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id})
    one, _ = run_stage(meta_train, cfg, inputs, StageContext(store, Runtime(catalog=catalog)))
    many, _ = run_stage(meta_train, cfg, inputs, StageContext(store, Runtime(engine="batched", client_batch=4,
                                                                             catalog=catalog), force=True))
    assert entry.calls and one.id == many.id and one.manifest.get("plugins")

    @dataclasses.dataclass(frozen=True)
    class OwnPath:  # a plugin meta-gradient without with_lr_grad
        name: str = "own-path"
        about: str = "a test's meta-gradient"

        def one(self, *args):
            return meta_grads.Fomaml().one(*args)

        def many(self, *args):
            return meta_grads.Fomaml().many(*args)

    assert meta_grads.with_lr_grad(OwnPath(), meta_grads.builtin("fomaml").lr) == OwnPath()
    with pytest.raises(ConfigError, match="--lr-grad doubled: the meta-gradient 'own-path' does not take an LR path"):
        meta_grads.with_lr_grad(OwnPath(), entry)
