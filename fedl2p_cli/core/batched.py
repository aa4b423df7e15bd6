"""Many clients as one computation: `torch.func.vmap` of the one-client functions (`finetune.train_step`,
`finetune.full_batch_moments`, `hypergrad.fomaml_client`, `hypergrad.ift_client`, `perfedavg.perfedavg_step`,
`functional.logit_sums`) over stacked per-client tensors (weights, beta, eta, BN statistics, batches), as the
torch.func model-ensembling example does. The maths is written once there; this module stacks, pads and schedules.

Ragged clients are padded and masked. A client's data is padded to the group's largest client and each step's batch
to the group's largest batch; a mask zeroes the padding's share of the loss and of the BN batch moments
(`core.masked`), so a padded batch's moments and mean loss are those of the client's own samples. A client with fewer
steps than the group's longest does nothing at the extra steps (its weights and running statistics are kept,
`torch.where`). Every client draws its batches from its own generator exactly as `finetune` does, so the group
computes, per client, the same function as one at a time; only the kernels differ (BN here is the composite mixing of
Eq. 2 at every beta, where the one-client path takes fused kernels at beta 0/1), so results agree to float tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import vmap

from . import kernels
from .autodiff import FUNC
from .bn import BNPolicy
from .finetune import ClientBN, FinetuneResult, Replay, Strategy, train_step
from .functional import Params, epochs_of_batches, forward, logit_sums, random_batch
from .hypergrad import IftSettings, fomaml_client, ift_client
from .masked import expand_to
from .perfedavg import perfedavg_step


def _plain(fn: Callable) -> Callable:
    """`fn` run with torch's own kernels (core.kernels: custom autograd nodes have no vmap rule)."""
    def run(*args: object) -> object:
        with kernels.plain():
            return fn(*args)
    return run


def stack(dicts: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    return {k: torch.stack([d[k] for d in dicts]) for k in dicts[0]}


def stack_bn(bns: list[ClientBN]) -> tuple[list[Tensor], list[Tensor]]:
    """N clients' BN statistics as one [N, C] tensor per layer (means, variances)."""
    return ([torch.stack(layer) for layer in zip(*(b.mean for b in bns))],
            [torch.stack(layer) for layer in zip(*(b.var for b in bns))])


def unstack(d: dict[str, Tensor], n: int) -> list[dict[str, Tensor]]:
    return [{k: v[i] for k, v in d.items()} for i in range(n)]


def pad_data(xs: list[Tensor], ys: list[Tensor]) -> tuple[Tensor, Tensor]:
    """Clients' samples padded to the largest client: [N, n_max, ...] (padding repeats sample 0: finite, masked)."""
    n = max(len(y) for y in ys)
    px = torch.stack([torch.cat([x, x[:1].expand(n - len(x), *x.shape[1:])]) for x in xs])
    py = torch.stack([torch.cat([y, y[:1].expand(n - len(y))]) for y in ys])
    return px, py


@dataclass
class Schedule:
    """Each client's batches as one padded index tensor: idx [N, T, B], mask [N, T, B] (1: a real sample) and
    active [N, T] (the client takes step t)."""

    idx: Tensor
    mask: Tensor
    active: Tensor
    last: list[Tensor]  # each client's last batch (its indices)

    @classmethod
    def of(cls, batches: list[list[Tensor]], device: torch.device) -> Schedule:
        steps = max(len(b) for b in batches)
        width = max((len(i) for b in batches for i in b), default=1)
        idx = torch.zeros(len(batches), steps, width, dtype=torch.long)
        mask = torch.zeros(len(batches), steps, width)
        for c, bs in enumerate(batches):
            for t, i in enumerate(bs):
                idx[c, t, :len(i)], mask[c, t, :len(i)] = i.cpu(), 1.0
        active = mask[:, :, 0] > 0
        last = [bs[-1] if bs else torch.arange(0) for bs in batches]
        return cls(idx.to(device), mask.to(device), active.to(device), last)


def _gather(data: Tensor, idx: Tensor) -> Tensor:
    """data [N, n, ...], idx [N, *shape] -> [N, *shape, ...]."""
    rows = torch.arange(len(idx), device=idx.device).view(-1, *([1] * (idx.dim() - 1)))
    return data[rows, idx]


def _step_fn(model: nn.Module) -> Callable:
    """One client's step under (beta, eta) (`finetune.train_step`): the new weights and running statistics (kept when
    not `active`), the loss and the gradient; vmapped over clients by `finetune_many`."""
    def step(p: Params, mean: list[Tensor], var: list[Tensor], x: Tensor, y: Tensor, mask: Tensor, beta: Tensor,
             lr: Tensor, active: Tensor,
             momentum: float = 0.1) -> tuple[Params, list[Tensor], list[Tensor], Tensor, list[Tensor]]:
        new, loss, g, moments = train_step(FUNC, model, p, x, y, beta, lr, mask)
        new = {k: torch.where(active, v, p[k]) for k, v in new.items()}
        new_mean, new_var = _moved(mean, var, [m for _, m in moments], active, momentum)
        return new, new_mean, new_var, loss, g
    return step


def finetune_many(model: nn.Module, params: list[Params], xs: list[Tensor], ys: list[Tensor], strategies: list[Strategy],
                  bns: list[ClientBN], epochs: int, batch_size: int, gens: list[torch.Generator],
                  client_bn: str = "precise", read: bool = True) -> list[FinetuneResult]:
    """`finetune` for N clients as one vmapped computation per step; per client the same as `finetune` (to float
    tolerance). Strategies with beta None (BN I) and with a beta cannot share a group. `read`: the training losses as
    floats (one host read for the group); else as 0-dim tensors left on the device."""
    n = len(params)
    dev = ys[0].device
    none = [s.beta is None for s in strategies]
    if any(none) and not all(none):
        raise ValueError("finetune_many: strategies with and without beta cannot share a group")
    n_bn = len(bns[0].mean)
    beta = torch.stack([torch.ones(n_bn, device=dev) if s.beta is None else s.beta.detach() for s in strategies])
    lr = torch.stack([s.lr.detach() for s in strategies])
    plans = [epochs_of_batches(len(y), batch_size, g, epochs) for y, g in zip(ys, gens)]
    sched = Schedule.of(plans, dev)
    px, py = pad_data(xs, ys)
    p = stack(params)
    mean, var = stack_bn(bns)
    step = _plain(vmap(_step_fn(model)))
    prev, grads, losses = p, [torch.zeros_like(v) for v in p.values()], []
    gsum = [torch.zeros_like(v) for v in p.values()]
    for t in range(sched.idx.shape[1]):
        act = sched.active[:, t]
        new, mean, var, loss, g = step(p, mean, var, _gather(px, sched.idx[:, t]), _gather(py, sched.idx[:, t]),
                                       sched.mask[:, t], beta, lr, act)
        prev = {k: _where(act, p[k], prev[k]) for k in p}
        grads = [_where(act, a, b) for a, b in zip(g, grads)]
        gsum = [_where(act, b + a, b) for a, b in zip(g, gsum)]
        p = new
        losses.append(torch.where(act, loss, 0.0).double())
    steps = sched.active.sum(1).clamp_min(1)
    avg = torch.stack(losses, 1).sum(1) / steps if losses else torch.zeros(n, dtype=torch.float64, device=dev)
    train_loss: list[float | Tensor] = avg.tolist() if read else list(avg)
    out_bn = [ClientBN([m[c] for m in mean], [v[c] for v in var]) for c in range(n)]
    if client_bn == "precise" and not any(none):
        out_bn = precise_bn_many(model, unstack(p, n), xs, list(beta))
    return [FinetuneResult(pc, bc, prc, last, loss, [g_[c] for g_ in grads], [g_[c] for g_ in gsum],
                           Replay(params[c], xs[c], ys[c], plans[c], lr[c]))
            for c, (pc, bc, prc, last, loss) in enumerate(zip(unstack(p, n), out_bn, unstack(prev, n), sched.last,
                                                             train_loss))]


def _where(active: Tensor, a: Tensor, b: Tensor) -> Tensor:
    return torch.where(expand_to(active, a), a, b)


@torch.no_grad()
def precise_bn_many(model: nn.Module, params: list[Params], xs: list[Tensor], betas: list[Tensor],
                    chunk: int = 1024) -> list[ClientBN]:
    """`precise_bn` for N clients: `finetune.full_batch_moments` vmapped over each client's own (masked) samples.
    Clients above `chunk` samples take `precise_bn`'s chunked passes one at a time (same function)."""
    from .finetune import full_batch_moments, precise_bn
    if max(len(x) for x in xs) > chunk:
        return [precise_bn(model, p, x, b) for p, x, b in zip(params, xs, betas)]
    px, _ = pad_data(xs, [torch.zeros(len(x), dtype=torch.long, device=x.device) for x in xs])
    mask = torch.stack([torch.arange(px.shape[1], device=px.device) < len(x) for x in xs]).to(px.dtype)

    def one(p: Params, x: Tensor, m: Tensor, beta: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        return full_batch_moments(model, p, x, beta, m)

    means, variances = _plain(vmap(one))(stack(params), px, mask, torch.stack(betas))
    return [ClientBN([mb[c] for mb in means], [vb[c] for vb in variances]) for c in range(len(xs))]


@dataclass
class FomamlOut:
    """N clients' meta-gradients (w.r.t. lambda), validation and training losses and the IFT's Neumann step ([N]
    tensors on the device: the caller decides when to read them)."""
    grads: list[dict[str, Tensor]]
    val_loss: Tensor
    train_loss: Tensor
    psi: Tensor | None = None


def fomaml_many(model: nn.Module, hyper: Callable[[dict, Tensor, Tensor], tuple[Tensor, Tensor]],
                lams: list[dict[str, Tensor]], inputs: list[tuple[Tensor, Tensor]], prev: list[Params],
                last: list[tuple[Tensor, Tensor]], val: list[tuple[Tensor, Tensor]], bns: list[ClientBN],
                val_stats: str = "running", eta_dirs: list[list[Tensor]] | None = None,
                eta_slopes: list[Tensor] | None = None) -> FomamlOut:
    """`hypergrad.fomaml_client` vmapped over N clients (padded, masked batches). `hyper(lam, xi, x)` -> (beta, eta)
    is the meta-nets' map (the same for every client; xi, x are each client's inputs). `eta_dirs`/`eta_slopes`: each
    client's LR path or slopes (`hypergrad.fomaml_gradient`'s eta_step/eta_slope)."""
    (lx, ly), lmask = _padded_batches(last)
    (vx, vy), vmask = _padded_batches(val)
    extra = _extras(eta_dirs, eta_slopes)

    def one(lam: dict, xi: Tensor, xin: Tensor, theta: Params, x: Tensor, y: Tensor, m: Tensor, xv: Tensor, yv: Tensor,
            mv: Tensor, cm: list[Tensor], cv: list[Tensor], ex: dict) -> tuple[dict[str, Tensor], Tensor, Tensor]:
        return fomaml_client(FUNC, model, lambda lm: hyper(lm, xi, xin), lam, theta, (x, y), (xv, yv), ClientBN(cm, cv),
                             val_stats, ex.get("path"), ex.get("slope"), m, mv)

    xi, xin = _inputs(hyper, lams, inputs)
    g, lv, lt = _plain(vmap(one))(stack(lams), xi, xin, stack(prev), lx, ly, lmask, vx, vy, vmask, *stack_bn(bns), extra)
    return FomamlOut(unstack(g, len(lams)), lv, lt)


def _extras(paths: list[list[Tensor]] | None, slopes: list[Tensor] | None,
            inner: list[list[Tensor]] | None = None) -> dict[str, Any]:
    """The optional per-client tensors, stacked, by name (vmap takes no None: an absent one is left out)."""
    out: dict[str, Any] = {}
    for name, v in (("path", paths), ("inner", inner)):
        if v is not None:
            out[name] = [torch.stack([c[k] for c in v]) for k in range(len(v[0]))]
    if slopes is not None:
        out["slope"] = torch.stack(slopes)
    return out


def _inputs(hyper: Callable, lams: list[dict[str, Tensor]], inputs: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """The clients' meta-net inputs, stacked; the meta-nets' module templates built (initialised, i.e. drawn) first,
    outside vmap."""
    with torch.no_grad():
        hyper(lams[0], *inputs[0])
    return torch.stack([i[0] for i in inputs]), torch.stack([i[1] for i in inputs])


def _padded_batches(batches: list[tuple[Tensor, Tensor]]) -> tuple[tuple[Tensor, Tensor], Tensor]:
    x, y = pad_data([b[0] for b in batches], [b[1] for b in batches])
    mask = torch.stack([torch.arange(x.shape[1], device=x.device) < len(b[1]) for b in batches]).to(x.dtype)
    return (x, y), mask


def val_batches(ys: list[Tensor], batch_size: int, gens: list[torch.Generator]) -> list[Tensor]:
    """Each client's validation batch, drawn as `meta_gradient` draws it."""
    return [random_batch(len(y), batch_size, g) for y, g in zip(ys, gens)]


def ift_many(model: nn.Module, hyper: Callable[[dict, Tensor, Tensor], tuple[Tensor, Tensor]],
             lams: list[dict[str, Tensor]], inputs: list[tuple[Tensor, Tensor]], theta_star: list[Params],
             train: list[tuple[Tensor, Tensor]], val: list[tuple[Tensor, Tensor]], bns: list[ClientBN], s: IftSettings,
             theta_train: list[Params] | None = None, inner_grads: list[list[Tensor]] | None = None,
             eta_dirs: list[list[Tensor]] | None = None, eta_slopes: list[Tensor] | None = None) -> FomamlOut:
    """`hypergrad.ift_client` vmapped over N clients (padded, masked batches): the Krylov basis and Neumann series are
    per client. `theta_train`/`inner_grads`, `eta_dirs`/`eta_slopes`: each client's `hypergrad.ift_hypergradient`
    theta_train/inner_grad and eta_step/eta_slope (None: none for every client)."""
    (tx, ty), tmask = _padded_batches(train)
    (vx, vy), vmask = _padded_batches(val)
    extra = _extras(eta_dirs, eta_slopes, inner_grads)
    th_t = stack(theta_star if theta_train is None else theta_train)

    def one(lam: dict, xi: Tensor, xin: Tensor, th_v: Params, th: Params, x: Tensor, y: Tensor, mk: Tensor, xv: Tensor,
            yv: Tensor, mv: Tensor, cm: list[Tensor], cv: list[Tensor],
            ex: dict) -> tuple[dict[str, Tensor], Tensor, Tensor, Tensor]:
        return ift_client(FUNC, model, lambda lm: hyper(lm, xi, xin), lam, th_v, (x, y), (xv, yv), ClientBN(cm, cv), s,
                          th, ex.get("inner"), ex.get("path"), ex.get("slope"), mk, mv)

    xi, xin = _inputs(hyper, lams, inputs)
    g, lv, lt, psi = _plain(vmap(one))(stack(lams), xi, xin, stack(theta_star), th_t, tx, ty, tmask, vx, vy, vmask,
                                       *stack_bn(bns), extra)
    return FomamlOut(unstack(g, len(lams)), lv, lt, psi)


def _perfedavg_step_fn(model: nn.Module, alpha: float) -> Callable:
    """One client's Per-FedAvg (HF) step on its three batches (`core.perfedavg.perfedavg_step`): the new weights
    (kept when not `active`), the running statistics moved by the step's three training-mode forwards (D, D', D'' in
    that order, as the module's own BN moves them) and the first batch's loss; vmapped over clients by
    `perfedavg_many`."""
    def step(p: Params, mean: list[Tensor], var: list[Tensor], x: Tensor, y: Tensor, mask: Tensor, lr: Tensor,
             active: Tensor) -> tuple[Params, list[Tensor], list[Tensor], Tensor]:
        new, loss, moments = perfedavg_step(FUNC, model, p, x, y, alpha, lr, mask)
        new = {k: torch.where(active, v, p[k]) for k, v in new.items()}
        for m in moments:
            mean, var = _moved(mean, var, m, active)
        return new, mean, var, loss
    return step


def _moved(mean: list[Tensor], var: list[Tensor], moments: list[tuple[Tensor, Tensor, Tensor]], active: Tensor,
           momentum: float = 0.1) -> tuple[list[Tensor], list[Tensor]]:
    """Running statistics after one training-mode forward's batch moments (the unbiased variance, as BN's own)."""
    return ([torch.where(active, (1 - momentum) * m + momentum * mb, m) for m, (mb, _, _) in zip(mean, moments)],
            [torch.where(active, (1 - momentum) * v + momentum * vb * (n / (n - 1).clamp_min(1)), v)
             for v, (_, vb, n) in zip(var, moments)])


def perfedavg_many(model: nn.Module, params: list[Params], bns: list[ClientBN], xs: list[Tensor], ys: list[Tensor],
                   batches: list[list[Tensor]], alpha: float, lrs: list[float]
                   ) -> list[tuple[Params, ClientBN, Tensor]]:
    """Per-FedAvg (HF) local updates for N clients as one vmapped computation per step: `batches[c]` is client c's
    batch indices, three per step (D, D', D'') in the order it drew them. Clients with fewer steps keep their weights
    and statistics at the extra steps. Per client: the new weights, running statistics and mean first-batch loss (a
    0-dim float64 tensor on the device), as `perfedavg_client` computes them to float rounding."""
    n, dev = len(params), ys[0].device
    sched = Schedule.of(batches, dev)
    steps = sched.idx.shape[1] // 3
    idx = sched.idx.view(n, steps, 3, -1)
    mask = sched.mask.view(n, steps, 3, -1)
    active = sched.active.view(n, steps, 3)[:, :, 0]
    px, py = pad_data(xs, ys)
    p = stack(params)
    mean, var = stack_bn(bns)
    lr = torch.tensor(lrs, device=dev)
    step = _plain(vmap(_perfedavg_step_fn(model, alpha)))
    total = torch.zeros(n, dtype=torch.float64, device=dev)
    for t in range(steps):  # the step's three batches in one gather: [N, 3, B, ...]
        p, mean, var, loss = step(p, mean, var, _gather(px, idx[:, t]), _gather(py, idx[:, t]), mask[:, t], lr,
                                  active[:, t])
        total = total + torch.where(active[:, t], loss.double(), 0.0)
    avg = total / active.sum(1).clamp_min(1)
    return [(pc, ClientBN([m[c] for m in mean], [v[c] for v in var]), avg[c]) for c, pc in enumerate(unstack(p, n))]


@torch.no_grad()
def scores_many(model: nn.Module, params: list[Params], data: list[tuple[Tensor, Tensor]], betas: list[Tensor],
                bns: list[ClientBN], samples: int = 2048, items: int = 32) -> Tensor:
    """`finetune.personalized_sums` under the paper's inference (beta mixing each client's running statistics, no batch
    statistics, so each sample's output is its own) for N fine-tunings, `items` at a time as one vmapped forward per
    chunk of samples: [N, 2] float64 (summed loss, correct answers) on the device. Fine-tunings that share a data set
    (one client's, several strategies or seeds) share one padded copy of it; a chunk holds about `samples` samples of
    all its fine-tunings together, so memory stays that of `items` weights and one large batch."""
    which, unique = _unique([d[0] for d in data])
    x, y = pad_data([data[i][0] for i in unique], [data[i][1] for i in unique])
    lengths = torch.tensor([len(data[i][1]) for i in unique], device=x.device)
    mask = torch.arange(x.shape[1], device=x.device) < lengths[:, None]
    run = _plain(vmap(_scores_fn(model)))
    out = []
    for lo in range(0, len(params), items):
        idx = torch.tensor(which[lo:lo + items], device=x.device)
        p, beta = stack(params[lo:lo + items]), torch.stack(betas[lo:lo + items])
        mean, var = stack_bn(bns[lo:lo + items])
        step = max(1, samples // len(idx))
        total = torch.zeros(len(idx), 2, dtype=torch.float64, device=x.device)
        for i in range(0, x.shape[1], step):
            total = total + run(p, x[idx, i:i + step], y[idx, i:i + step], mask[idx, i:i + step], beta, mean, var)
        out.append(total)
    return torch.cat(out)


def _scores_fn(model: nn.Module) -> Callable:
    """One fine-tuning's summed loss and correct answers on its (masked) samples under the running-statistics policy."""
    def one(p: Params, xb: Tensor, yb: Tensor, mb: Tensor, beta: Tensor, cm: list[Tensor], cv: list[Tensor]) -> Tensor:
        loss, right = logit_sums(forward(model, p, xb, BNPolicy(beta, cm, cv, train=False)), yb, mb)
        return torch.stack([loss, right.double()])
    return one


def _unique(tensors: list[Tensor]) -> tuple[list[int], list[int]]:
    """Each tensor's index among the distinct ones (by identity), and the first position of each distinct one."""
    seen: dict[int, int] = {}
    first: list[int] = []
    for i, t in enumerate(tensors):
        if id(t) not in seen:
            seen[id(t)] = len(first)
            first.append(i)
    return [seen[id(t)] for t in tensors], first
