"""FedL2P client update (Alg. 1 lines 6-12): K iterations of {fine-tune under lambda; meta-gradient; SGD on lambda}.

A pure function of (pretrained parameters, lambda, the client's data and stored statistics): it returns the
client's new lambda, its sample count and metrics, ready to run inside any federated runtime.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..core.client import ClientData, Timer
from ..core.config import AT_LEAST_1, NON_NEGATIVE, POSITIVE, UNIT, between
from ..core.finetune import ClientBN, Strategy, finetune, personalized_accuracy
from ..core.functional import Params, random_batch
from ..core.hypergrad import fomaml_gradient, ift_hypergradient
from ..core.metanets import DEFAULT_META_LR, Lambda, grad_report, hyperparameters, sgd_update


IFT_AT = ("star", "last-step")


class Diverged(Exception):
    """A non-finite loss or meta-gradient."""


@dataclass(kw_only=True)
class MetaConfig:
    iterations: int = field(default=3, metadata=AT_LEAST_1)         # K (the authors' CIFAR-10 config: outer_loop_epochs 3)
    epochs: int = field(default=5, metadata=AT_LEAST_1)             # e, fine-tuning epochs per iteration
    batch_size: int = field(default=32, metadata=between(2))
    base_lr: float = field(default=1e-3, metadata=POSITIVE)       # fine-tuning LR of the baselines and initial eta~
    q: int = field(default=3, metadata=NON_NEGATIVE)                  # Neumann terms
    psi: float = field(default=0.1, metadata=POSITIVE)
    scale_by_psi: bool = False  # Lorraine et al.'s psi * p (the paper's Alg. 2 omits it)
    meta_grad: str = "ift"      # ift | fomaml (FOMAML+, App. F)
    hessian: str = "fo"         # fo (inner gradient held constant in theta) | exact (see core.hypergrad)
    fixed_beta: float = field(default=1.0, metadata=UNIT | {"option": "--beta"})     # beta when BNNet is not learned
    lr_bnnet: float = field(default=DEFAULT_META_LR["bnnet"], metadata=NON_NEGATIVE)
    lr_lrnet: float = field(default=DEFAULT_META_LR["lrnet"], metadata=NON_NEGATIVE)
    lr_eta: float = field(default=DEFAULT_META_LR["eta"], metadata=NON_NEGATIVE)
    psi_power: int = field(default=0, metadata=NON_NEGATIVE)          # >0: psi = min(psi, 1/lambda_max(H_T)) by that many power iterations (not in the paper)
    client_bn: str = "precise"  # precise: recompute client BN statistics after fine-tuning | running (paper)
    hidden_bias: str = "paper"  # paper: every meta-net bias is the constant (App. E) | zero: hidden biases 0
    # BNNet's bias constant, so the initial beta; App. E: 0.5. Left out of the artifact id at 0.5 (added later).
    beta_init: float = field(default=0.5, metadata=UNIT | {"option": "--beta-init", "identity_default": True})
    # Xavier gain of the meta-nets' weights; App. E: 0.1. Left out of the artifact id at 0.1 (added later).
    init_gain: float = field(default=0.1, metadata=POSITIVE | {"option": "--init-gain", "identity_default": True})
    # Where the IFT differentiates L_T (Eq. 9-10): star = at theta* with one more step on a fresh train batch |
    # last-step = the last fine-tuning step (theta = the parameters before it, theta' = theta*, its batch and, with
    # hessian fo, its gradient: one forward-backward fewer), as the authors' code and the paper's "theta* = theta'".
    # Left out of the artifact id at "star" (added later).
    ift_at: str = field(default="star", metadata={"option": "--ift-at", "identity_default": True})
    # The validation loss's BN statistics: running = beta mixes the client's statistics (the paper) | test-batch = beta
    # mixes each validation batch's statistics, to learn lambda for `personalize --eval-stats test-batch` (not in the
    # paper). Left out of the artifact id at "running" (added later).
    val_stats: str = field(default="running", metadata={"option": "--val-stats", "identity_default": True})
    # Clamp eta~ at 0 (straight-through) so a learned LR is never negative: the tensor is frozen instead of pushed
    # uphill (not in the paper; the authors' eta~ is unconstrained). Left out of the artifact id at False (added later).
    eta_nonneg: bool = field(default=False, metadata={"option": "--eta-nonneg", "identity_default": True})

    @property
    def meta_lrs(self) -> dict[str, float]:
        return {"bnnet": self.lr_bnnet, "lrnet": self.lr_lrnet, "eta": self.lr_eta}


@dataclass
class ClientResult:
    lam: Lambda
    n: int
    val_loss: float      # full validation set, after fine-tuning under the lambda this client received
    train_loss: float
    beta: Tensor
    eta: Tensor
    report: dict  # per-block meta-gradient norms before clipping and share clipped, mean over the K iterations


def hyper_fn(xi: Tensor, x: Tensor, n_params: int, cfg: MetaConfig):
    return lambda lam: hyperparameters(lam, xi, x, n_params, cfg.base_lr, cfg.fixed_beta, cfg.eta_nonneg)


def _finite(lam: Lambda) -> bool:
    return all(torch.isfinite(v).all() for v in lam.values())


def client_update(model: nn.Module, theta_g: Params, lam: Lambda, xi: Tensor, x: Tensor, bn0: ClientBN,
                  data: ClientData, cfg: MetaConfig, gen: torch.Generator, timer: Timer | None = None) -> ClientResult:
    timer = timer or Timer()
    hyper = hyper_fn(xi, x, len(theta_g), cfg)
    (xt, yt), (xv, yv) = data.train, data.val
    first_val, reports = None, []
    for _ in range(cfg.iterations):
        with torch.no_grad():
            beta, eta = hyper(lam)
        with timer.section("finetune"):
            ft = finetune(model, theta_g, xt, yt, Strategy(beta, eta), bn0, cfg.epochs, cfg.batch_size, gen, cfg.client_bn)
        if first_val is None:
            with timer.section("finetune"):
                first_val, _ = personalized_accuracy(model, ft.params, xv, yv, Strategy(beta, eta), ft.bn, cfg.batch_size,
                                                     cfg.val_stats)
            first = (beta, eta, ft.train_loss)
        vi = random_batch(len(yv), cfg.batch_size, gen)
        with timer.section("hypergrad"):
            if cfg.meta_grad == "ift":
                last = cfg.ift_at == "last-step"  # L_T at the last fine-tuning step, on its batch and gradient
                ti = ft.last_batch if last else random_batch(len(yt), cfg.batch_size, gen)
                mg = ift_hypergradient(model, ft.params, lam, hyper, (xt[ti], yt[ti]), (xv[vi], yv[vi]), ft.bn,
                                       cfg.q, cfg.psi, cfg.scale_by_psi, cfg.hessian, cfg.psi_power,
                                       theta_train=ft.prev_params if last else None,
                                       inner_grad=ft.last_grad if last else None, val_stats=cfg.val_stats)
            else:
                mg = fomaml_gradient(model, ft.prev_params, lam, hyper, (xt[ft.last_batch], yt[ft.last_batch]),
                                     (xv[vi], yv[vi]), ft.bn, cfg.val_stats)
        if not (math.isfinite(mg.val_loss) and math.isfinite(ft.train_loss) and _finite(mg.grads)):
            raise Diverged(f"non-finite loss or meta-gradient (val {mg.val_loss:.3g}, train {ft.train_loss:.3g})")
        reports.append(grad_report(mg.grads))
        lam = sgd_update(lam, mg.grads, cfg.meta_lrs)
    if not math.isfinite(first_val):
        raise Diverged(f"non-finite validation loss {first_val}")
    report = {k: sum(r[k] for r in reports) / len(reports) for k in reports[0]}
    return ClientResult(lam, len(yt), first_val, first[2], first[0], first[1], report)
