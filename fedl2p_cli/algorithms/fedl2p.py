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

from ..core.batched import finetune_many, scores_many
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
            first = (beta, eta, float(ft.train_loss))
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
    val, train = float(mg.val_loss), float(ft.train_loss)
    if math.isfinite(val) and math.isfinite(train) and finite_grads:
        return None
    return Diverged(f"non-finite loss or meta-gradient (val {val:.3g}, train {train:.3g})")


def _meta_step(lam: Lambda, mg: MetaGrad, cfg: MetaConfig, reports: list[dict]) -> Lambda:
    """Alg. 1 line 11: SGD on lambda; the step's gradient report (on the device) and the Neumann step the IFT took
    kept."""
    took_psi = isinstance(mg.psi, Tensor) or mg.psi != 0  # a tensor's value is not read here (a host sync)
    reports.append(grad_report(mg.grads) | ({"psi": mg.psi} if took_psi else {}))
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
    order. Divergence is decided on the device: a client whose losses or meta-gradient are not finite keeps its
    lambda from then on (it still computes with the group, its own generator only) and gets its `Diverged` in place of
    a result. So the host reads the device once per group, at the end: losses, finiteness and reports together
    (`bench/host_syncs.py` counts the reads)."""
    timer = timer or Timer()
    n_p, n = len(theta_g), len(lams)
    hypers = [hyper_fn(xi, x, n_p, cfg, head) for xi, x in inputs]
    lams = list(lams)
    alive = torch.ones(n, dtype=torch.bool, device=theta_g[next(iter(theta_g))].device)
    checks: list[tuple[Tensor, Tensor, Tensor]] = []  # per iteration: finite [N], validation and training losses [N]
    first_sum: list[Tensor] = []  # each client's summed validation loss after iteration 1
    first: list[tuple[Tensor, Tensor]] = []  # (beta, eta) of iteration 1 (its training loss is in `checks`)
    reports: list[list[dict]] = [[] for _ in lams]
    for k in range(cfg.iterations):
        with torch.no_grad():
            strat = [Strategy(*hyper(lam)) for hyper, lam in zip(hypers, lams)]
        with timer.section("finetune"):
            fts = finetune_many(model, [theta_g] * n, [d.train[0] for d in datas], [d.train[1] for d in datas], strat,
                                bn0s, cfg.epochs, cfg.batch_size, gens, cfg.client_bn, read=False)
            if k == 0:
                first_sum = _first_val_sums(model, fts, datas, strat, cfg)
                first = [(cast(Tensor, s.beta), s.lr) for s in strat]  # hyper_fn's beta: never None
        with timer.section("hypergrad"):
            mgs = _meta_gradients(model, fts, lams, inputs, datas, cfg, gens, entry, head)
        check = _checks(mgs, fts)
        checks.append(check)
        alive = alive & check[0]
        lams = [_kept(alive[c], _meta_step(lam, mg, cfg, reports[c]), lam) for c, (lam, mg) in enumerate(zip(lams, mgs))]
    return _group_results(lams, datas, checks, first_sum, first, reports)


def _first_val_sums(model: nn.Module, fts: list[FinetuneResult], datas: list[ClientData], strat: list[Strategy],
                    cfg: MetaConfig) -> list[Tensor]:
    """Each client's summed validation loss after the first fine-tuning, on the device: one vmapped computation under
    the paper's inference (--val-stats running), else one client at a time (batch statistics)."""
    if cfg.val_stats == "running" and len(fts) > 1:
        sums = scores_many(model, [ft.params for ft in fts], [d.val for d in datas],
                           [cast(Tensor, s.beta) for s in strat], [ft.bn for ft in fts])
        return list(sums[:, 0])
    return [personalized_loss_sum(model, ft.params, d.val[0], d.val[1], s, ft.bn, cfg.batch_size, cfg.val_stats)
            for ft, d, s in zip(fts, datas, strat)]


def _checks(mgs: list[MetaGrad], fts: list[FinetuneResult]) -> tuple[Tensor, Tensor, Tensor]:
    """Whether each client's losses and meta-gradient are finite, and the losses, as [N] tensors on the device."""
    dev = next(iter(mgs[0].grads.values())).device
    vals = [torch.as_tensor(m.val_loss, dtype=torch.float64, device=dev) for m in mgs]
    trains = [torch.as_tensor(ft.train_loss, dtype=torch.float64, device=dev) for ft in fts]
    val, train = torch.stack(vals), torch.stack(trains)
    grads = torch.stack([torch.stack([torch.isfinite(v).all() for v in m.grads.values()]).all() for m in mgs])
    return grads & torch.isfinite(val) & torch.isfinite(train), val, train


def _kept(alive: Tensor, new: Lambda, old: Lambda) -> Lambda:
    """`new` where the client is still alive, else `old` (decided on the device: no host read)."""
    return {k: torch.where(alive, new[k], old[k]) for k in old}


def _group_results(lams: list[Lambda], datas: list[ClientData], checks: list[tuple[Tensor, Tensor, Tensor]],
                   first_sum: list[Tensor], first: list[tuple[Tensor, Tensor]],
                   reports: list[list[dict]]) -> list[ClientResult | Diverged]:
    """The group's results from one host read: each client's first non-finite iteration (its `Diverged`, as
    `client_update` raises it), else its `ClientResult`."""
    n, iters = len(lams), len(checks)
    table = torch.stack([torch.stack([ok.double(), val, train]) for ok, val, train in checks])  # [K, 3, N]
    read, vals = _read_reports(reports, list(table.view(-1)) + first_sum)
    grid = [[vals[(3 * k + j) * n:(3 * k + j + 1) * n] for j in range(3)] for k in range(iters)]  # [K][ok, val, train]
    sums = vals[3 * iters * n:]
    out: list[ClientResult | Diverged] = []
    for c in range(n):
        bad = next((k for k in range(iters) if not grid[k][0][c]), None)
        if bad is not None:
            _, val, train = grid[bad]
            out.append(Diverged(f"non-finite loss or meta-gradient (val {val[c]:.3g}, train {train[c]:.3g})"))
            continue
        beta, eta = first[c]
        first_val = sums[c] / max(len(datas[c].val[1]), 1)
        out.append(_finish(lams[c], len(datas[c].train[1]), first_val, (beta, eta, grid[0][2][c]), read[c]))
    return out


def _meta_gradients(model: nn.Module, fts: list[FinetuneResult], lams: list[Lambda], inputs: list,
                    datas: list[ClientData], cfg: MetaConfig, gens: list[torch.Generator],
                    entry: MetaGradient | None = None, head: MetaHead | None = None) -> list[MetaGrad]:
    """Each client's meta-gradient, as one computation where the `--meta-grad` entry has `many`, else one at a time."""
    hyper = head_fn(len(fts[0].params), cfg, head)
    return meta_grads.group(entry or meta_grads.builtin(cfg.meta_grad, cfg.lr_grad), model, fts, lams, hyper, inputs,
                            datas, cfg, gens)
