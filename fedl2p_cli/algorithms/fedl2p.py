"""FedL2P client update (Alg. 1 lines 6-12): K iterations of {fine-tune under lambda; meta-gradient; SGD on lambda}.

A pure function of (pretrained parameters, lambda, the client's data and stored statistics): it returns the
client's new lambda, its sample count and metrics, ready to run inside any federated runtime.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..core.client import ClientData, Timer
from ..core.finetune import ClientBN, FinetuneResult, Strategy, finetune, personalized_accuracy
from ..core.functional import Params, random_batch
from ..core.hypergrad import MetaGrad, fomaml_gradient, ift_hypergradient
from ..core.settings import MetaConfig
from ..core.metanets import Lambda, grad_report, hyperparameters, sgd_update


class Diverged(Exception):
    """A non-finite loss or meta-gradient."""


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
    return lambda lam: hyperparameters(lam, xi, x, n_params, cfg.base_lr, cfg.fixed_beta, cfg.eta_nonneg, cfg.beta_output)


def _finite(lam: Lambda) -> bool:
    """One host read for every tensor (on a GPU each `bool()` waits for the device)."""
    return bool(torch.stack([torch.isfinite(v).all() for v in lam.values()]).all())


def meta_gradient(model: nn.Module, ft: FinetuneResult, lam: Lambda, hyper, data: ClientData, cfg: MetaConfig,
                  gen: torch.Generator) -> MetaGrad:
    """The meta-gradient of one iteration (Alg. 1 line 10) after fine-tuning `ft`, on one validation batch."""
    (xt, yt), (xv, yv) = data.train, data.val
    vi = random_batch(len(yv), cfg.batch_size, gen)
    if cfg.meta_grad == "fomaml":
        return fomaml_gradient(model, ft.prev_params, lam, hyper, (xt[ft.last_batch], yt[ft.last_batch]),
                               (xv[vi], yv[vi]), ft.bn, cfg.val_stats)
    last = cfg.ift_at == "last-step"  # L_T at the last fine-tuning step, on its batch and gradient
    ti = ft.last_batch if last else random_batch(len(yt), cfg.batch_size, gen)
    return ift_hypergradient(model, ft.params, lam, hyper, (xt[ti], yt[ti]), (xv[vi], yv[vi]), ft.bn,
                             cfg.q, cfg.psi, cfg.scale_by_psi, cfg.hessian, cfg.psi_power,
                             theta_train=ft.prev_params if last else None,
                             inner_grad=ft.last_grad if last else None, val_stats=cfg.val_stats,
                             eta_step=ft.last_grad if cfg.eta_grad == "last-step" else None)


def bound_eta(lam: Lambda, cfg: MetaConfig) -> Lambda:
    """--eta-bound (IFT only): eta~ projected into [base LR / B, base LR x B] (see MetaConfig.eta_bound)."""
    if cfg.meta_grad != "ift" or not cfg.eta_bound or "eta" not in lam:
        return lam
    return lam | {"eta": lam["eta"].clamp(cfg.base_lr / cfg.eta_bound, cfg.base_lr * cfg.eta_bound)}


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
        with timer.section("hypergrad"):
            mg = meta_gradient(model, ft, lam, hyper, data, cfg, gen)
        if not (math.isfinite(mg.val_loss) and math.isfinite(ft.train_loss) and _finite(mg.grads)):
            raise Diverged(f"non-finite loss or meta-gradient (val {mg.val_loss:.3g}, train {ft.train_loss:.3g})")
        reports.append(grad_report(mg.grads) | ({"psi": mg.psi} if mg.psi else {}))  # the Neumann step the IFT took
        lam = bound_eta(sgd_update(lam, mg.grads, cfg.meta_lrs), cfg)
    if not math.isfinite(first_val):
        raise Diverged(f"non-finite validation loss {first_val}")
    report = {k: sum(r[k] for r in reports) / len(reports) for k in reports[0]}
    return ClientResult(lam, len(yt), first_val, first[2], first[0], first[1], report)
