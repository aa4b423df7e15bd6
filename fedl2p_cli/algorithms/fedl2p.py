"""FedL2P client update (Alg. 1 lines 6-12): K iterations of {fine-tune under lambda; meta-gradient; SGD on lambda}.

A pure function of (pretrained parameters, lambda, the client's data and stored statistics): it returns the
client's new lambda, its sample count and metrics, ready to run inside any federated runtime.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor, nn

from ..core.batched import finetune_many
from ..core.client import ClientData, Timer
from ..core.finetune import ClientBN, FinetuneResult, Strategy, finetune, personalized_accuracy, personalized_loss_sum
from ..core.functional import Params
from ..core.hypergrad import MetaGrad
from ..core.metanets import Lambda, grad_report, read_values, sgd_update
from ..core.settings import MetaConfig
from ..protocols import MetaHead
from . import heads, meta_grads
from .meta_grads import MetaGradient


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


def head_fn(n_params: int, cfg: MetaConfig, head: MetaHead | None = None):
    """(lambda, xi, x) -> (beta, eta) under `head`, the stage's --head entry (None: the built-in of cfg.head)."""
    entry = head or heads.builtin(cfg.head)
    return lambda lam, xi, x: entry.hyperparameters(lam, xi, x, n_params, cfg)


def hyper_fn(xi: Tensor, x: Tensor, n_params: int, cfg: MetaConfig, head: MetaHead | None = None):
    fn = head_fn(n_params, cfg, head)
    return lambda lam: fn(lam, xi, x)


def _finite(lams: list[Lambda]) -> list[bool]:
    """Whether each lambda is finite: one host read for all of them (on a GPU each `bool()` waits for the device)."""
    return torch.stack([torch.stack([torch.isfinite(v).all() for v in lam.values()]).all() for lam in lams]).tolist()


def meta_gradient(model: nn.Module, ft: FinetuneResult, lam: Lambda, hyper, data: ClientData, cfg: MetaConfig,
                  gen: torch.Generator, entry: MetaGradient | None = None) -> MetaGrad:
    """The meta-gradient of one iteration (Alg. 1 line 10) after fine-tuning `ft`: `entry`, the catalog's
    `--meta-grad` entry the stage looked up (None: the built-in of that name, algorithms/meta_grads.py)."""
    return (entry or meta_grads.builtin(cfg.meta_grad, cfg.lr_grad)).one(model, ft, lam, hyper, data, cfg, gen)


def bound_eta(lam: Lambda, cfg: MetaConfig) -> Lambda:
    """--eta-bound (IFT only): eta~ projected into [base LR / B, base LR x B] (see MetaConfig.eta_bound)."""
    if cfg.meta_grad != "ift" or not cfg.eta_bound or "eta" not in lam:
        return lam
    return lam | {"eta": lam["eta"].clamp(cfg.base_lr / cfg.eta_bound, cfg.base_lr * cfg.eta_bound)}


def client_update(model: nn.Module, theta_g: Params, lam: Lambda, xi: Tensor, x: Tensor, bn0: ClientBN,
                  data: ClientData, cfg: MetaConfig, gen: torch.Generator, timer: Timer | None = None,
                  entry: MetaGradient | None = None, head: MetaHead | None = None) -> ClientResult:
    """K iterations of {fine-tune under lambda; meta-gradient (`entry`: the stage's --meta-grad entry, None: the
    built-in of cfg.meta_grad); SGD on lambda} for one client, its strategy from `head` (the --head entry)."""
    timer = timer or Timer()
    hyper = hyper_fn(xi, x, len(theta_g), cfg, head)
    (xt, yt), (xv, yv) = data.train, data.val
    first_val: float | None = None
    reports: list[dict] = []
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
            mg = meta_gradient(model, ft, lam, hyper, data, cfg, gen, entry)
        if (bad := _diverged(mg, ft, _finite([mg.grads])[0])) is not None:
            raise bad
        lam = _meta_step(lam, mg, cfg, reports)
    read = _read_reports([reports])[0][0]
    done = _finish(lam, len(yt), first_val, first, read)  # type: ignore[arg-type]  # iterations >= 1 (validated)
    if isinstance(done, Diverged):
        raise done
    return done


def _diverged(mg: MetaGrad, ft: FinetuneResult, finite_grads: bool) -> Diverged | None:
    if math.isfinite(mg.val_loss) and math.isfinite(ft.train_loss) and finite_grads:
        return None
    return Diverged(f"non-finite loss or meta-gradient (val {mg.val_loss:.3g}, train {ft.train_loss:.3g})")


def _meta_step(lam: Lambda, mg: MetaGrad, cfg: MetaConfig, reports: list[dict]) -> Lambda:
    """Alg. 1 line 11: SGD on lambda; the step's gradient report (on the device) and the Neumann step the IFT took
    kept."""
    reports.append(grad_report(mg.grads) | ({"psi": mg.psi} if mg.psi else {}))
    return bound_eta(sgd_update(lam, mg.grads, cfg.meta_lrs), cfg)


def _read_reports(reports: list[list[dict]], extra: Sequence[Tensor] = ()) -> tuple[list[list[dict]], list[float]]:
    """Clients' gradient reports (and `extra` 0-dim tensors) as Python floats, in one host read for them all."""
    tensors = [v for rs in reports for r in rs for v in r.values() if isinstance(v, Tensor)] + list(extra)
    vals = iter(read_values(tensors))
    read = [[{k: next(vals) if isinstance(v, Tensor) else v for k, v in r.items()} for r in rs] for rs in reports]
    return read, list(vals)


def _finish(lam: Lambda, n: int, first_val: float, first: tuple[Tensor, Tensor, float], reports: list[dict]
            ) -> ClientResult | Diverged:
    """The client's result: its lambda, the first iteration's validation loss, beta, eta and training loss, and
    the mean gradient report."""
    if not math.isfinite(first_val):
        return Diverged(f"non-finite validation loss {first_val}")
    report = {k: sum(r[k] for r in reports) / len(reports) for k in reports[0]}
    beta, eta, train = first
    return ClientResult(lam, n, first_val, train, beta, eta, report)


def client_update_many(model: nn.Module, theta_g: Params, lams: list[Lambda], inputs: list[tuple[Tensor, Tensor]],
                       bn0s: list[ClientBN], datas: list[ClientData], cfg: MetaConfig, gens: list[torch.Generator],
                       timer: Timer | None = None, entry: MetaGradient | None = None,
                       head: MetaHead | None = None) -> list[ClientResult | Diverged]:
    """`client_update` for a group of clients in lock-step, each iteration's fine-tuning and meta-gradient (FOMAML+ or
    the IFT) one vmapped computation (`core.batched`).
    Per client the same as `client_update` to float tolerance: every client draws from its own generator in the same
    order. A client that diverges gets its `Diverged` in place of a result and leaves the group. The host reads the
    device once per iteration (the group's losses and whether its meta-gradients are finite, which decide who stays)
    and once at the end (`bench/host_syncs.py` counts them)."""
    timer = timer or Timer()
    n_p = len(theta_g)
    hypers = [hyper_fn(xi, x, n_p, cfg, head) for xi, x in inputs]
    out: list[ClientResult | Diverged | None] = [None] * len(lams)
    lams = list(lams)
    first_sum: list[Tensor] = []  # each client's summed validation loss after iteration 1, read at the end
    first: list[tuple[Tensor, Tensor, float] | None] = [None] * len(lams)  # (beta, eta, train loss) of iteration 1
    reports: list[list[dict]] = [[] for _ in lams]
    for k in range(cfg.iterations):
        live = [c for c in range(len(lams)) if out[c] is None]
        if not live:
            break
        with torch.no_grad():
            strat = {c: Strategy(*hypers[c](lams[c])) for c in live}
        with timer.section("finetune"):
            fts = dict(zip(live, finetune_many(model, [theta_g] * len(live), [datas[c].train[0] for c in live],
                                               [datas[c].train[1] for c in live], [strat[c] for c in live],
                                               [bn0s[c] for c in live], cfg.epochs, cfg.batch_size,
                                               [gens[c] for c in live], cfg.client_bn)))
            if k == 0:
                for c in live:
                    xv, yv = datas[c].val
                    first_sum.append(personalized_loss_sum(model, fts[c].params, xv, yv, strat[c], fts[c].bn,
                                                           cfg.batch_size, cfg.val_stats))
                    first[c] = (cast(Tensor, strat[c].beta), strat[c].lr, fts[c].train_loss)  # hyper_fn's beta: never None
        with timer.section("hypergrad"):
            mgs = _meta_gradients(model, fts, lams, inputs, datas, cfg, gens, live, n_p, entry, head)
        for c, finite in zip(live, _finite([mgs[c].grads for c in live])):
            out[c] = _diverged(mgs[c], fts[c], finite)
            if out[c] is None:
                lams[c] = _meta_step(lams[c], mgs[c], cfg, reports[c])
    read, sums = _read_reports(reports, first_sum)
    first_val = [s / max(len(d.val[1]), 1) for s, d in zip(sums, datas)]
    return [o if o is not None else _finish(lams[c], len(datas[c].train[1]), first_val[c], first[c], read[c])  # type: ignore[arg-type]  # set in iteration 1
            for c, o in enumerate(out)]


def _meta_gradients(model: nn.Module, fts: dict, lams: list[Lambda], inputs: list, datas: list[ClientData],
                    cfg: MetaConfig, gens: list[torch.Generator], live: list[int], n_p: int,
                    entry: MetaGradient | None = None, head: MetaHead | None = None) -> dict[int, MetaGrad]:
    """Each live client's meta-gradient, as one computation (the `--meta-grad` entry's `many`)."""
    hyper = head_fn(n_p, cfg, head)
    out = (entry or meta_grads.builtin(cfg.meta_grad, cfg.lr_grad)).many(model, [fts[c] for c in live], [lams[c] for c in live], hyper,
                                             [inputs[c] for c in live], [datas[c] for c in live], cfg,
                                             [gens[c] for c in live])
    return dict(zip(live, out))
