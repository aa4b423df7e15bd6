"""Many clients' fine-tuning and FOMAML+ meta-gradients as one computation: `torch.func.vmap` over stacked
per-client tensors (weights, beta, eta, BN statistics, batches), as the torch.func model-ensembling example does.

Ragged clients are padded and masked. A client's data is padded to the group's largest client and each step's batch
to the group's largest batch; a mask zeroes the padding's share of the loss and of the BN batch moments, so a
padded batch's moments and mean loss are those of the client's own samples. A client with fewer steps than the
group's longest does nothing at the extra steps (its weights and running statistics are kept, `torch.where`).
Every client draws its batches from its own generator exactly as `finetune` does, so the group computes, per client,
the same function as one at a time; only the kernels differ (BN here is the composite mixing of Eq. 2 at every
beta, where the one-client path takes fused kernels at beta 0/1), so results agree to float tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import grad, grad_and_value, vjp, vmap

from . import kernels
from .bn import BNPolicy, MixBN, _dims, _expand, normalize_with
from .finetune import ClientBN, FinetuneResult, Replay, Strategy, inference_policy
from .functional import Params, epochs_of_batches, forward, random_batch


@dataclass
class MaskedPolicy(BNPolicy):
    """BN with batch statistics over the masked samples (mask [N] of 0/1), mixed with the pretrained ones by beta
    (`train`: Eq. 2 in training; otherwise evaluation with batch statistics, `--val-stats test-batch`). The moments
    each layer saw are kept in `moments` (by BN index) for the caller to return: under vmap nothing may leak out
    by side effect. With client statistics (evaluation, `client_mean` given) it is `BNPolicy`'s own path."""

    mask: Tensor | None = None
    moments: dict[int, tuple[Tensor, Tensor, Tensor]] = field(default_factory=dict)  # mean, var, count

    def normalize(self, m: MixBN, x: Tensor) -> Tensor:
        if not self.train and self.client_mean is not None:
            return super().normalize(m, x)
        assert self.mask is not None
        w = _expand_to(self.mask, x)
        count = self.mask.sum() * (x.numel() // (x.shape[0] * x.shape[1]))
        dims = _dims(x)
        mean_b = (x * w).sum(dims) / count.clamp_min(1)
        var_b = ((x - _expand(mean_b, x)).square() * w).sum(dims) / count.clamp_min(1)
        self.moments[m.bn_index] = (mean_b, var_b, count)
        return normalize_with(m, x, *self.mixed(m, mean_b, var_b))


def _plain(fn: Callable) -> Callable:
    """`fn` run with torch's own kernels (core.kernels: custom autograd nodes have no vmap rule)."""
    def run(*args: object) -> object:
        with kernels.plain():
            return fn(*args)
    return run


def masked_ce(model: nn.Module, params: Params, x: Tensor, y: Tensor, mask: Tensor, pol: BNPolicy) -> Tensor:
    """Mean cross-entropy over the masked samples."""
    per = F.cross_entropy(forward(model, params, x, pol), y, reduction="none")
    return (per * mask).sum() / mask.sum().clamp_min(1)


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
    """One client's step under (beta, eta): the new weights and running statistics (kept when not `active`), the
    loss and the gradient; vmapped over clients by `finetune_many`."""
    def loss_fn(p: Params, x: Tensor, y: Tensor, mask: Tensor, beta: Tensor) -> tuple[Tensor, tuple]:
        pol = MaskedPolicy(beta, train=True, mask=mask)
        loss = masked_ce(model, p, x, y, mask, pol)
        order = sorted(pol.moments)
        return loss, (loss.detach(), [pol.moments[i] for i in order])

    def step(p: Params, mean: list[Tensor], var: list[Tensor], x: Tensor, y: Tensor, mask: Tensor, beta: Tensor,
             lr: Tensor, active: Tensor,
             momentum: float = 0.1) -> tuple[Params, list[Tensor], list[Tensor], Tensor, list[Tensor]]:
        g, (loss, moments) = grad(loss_fn, has_aux=True)(p, x, y, mask, beta)
        new = {k: torch.where(active, v - e * g[k], v) for (k, v), e in zip(p.items(), lr)}
        new_mean, new_var = _moved(mean, var, moments, active, momentum)
        return new, new_mean, new_var, loss, [g[k] for k in p]
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
    return torch.where(_expand_to(active, a), a, b)


def _expand_to(v: Tensor, x: Tensor) -> Tensor:
    return v.view(-1, *([1] * (x.dim() - 1)))


@torch.no_grad()
def precise_bn_many(model: nn.Module, params: list[Params], xs: list[Tensor], betas: list[Tensor],
                    chunk: int = 1024) -> list[ClientBN]:
    """`precise_bn` for N clients: one vmapped full-batch training-mode forward over each client's own (masked)
    samples. Clients above `chunk` samples take `precise_bn`'s chunked passes one at a time (same function)."""
    from .finetune import precise_bn
    if max(len(x) for x in xs) > chunk:
        return [precise_bn(model, p, x, b) for p, x, b in zip(params, xs, betas)]
    px, _ = pad_data(xs, [torch.zeros(len(x), dtype=torch.long, device=x.device) for x in xs])
    mask = torch.stack([torch.arange(px.shape[1], device=px.device) < len(x) for x in xs]).to(px.dtype)

    def one(p: Params, x: Tensor, m: Tensor, beta: Tensor) -> list[tuple[Tensor, Tensor]]:
        pol = MaskedPolicy(beta, train=True, mask=m)
        forward(model, p, x, pol)
        return [pol.moments[i][:2] for i in sorted(pol.moments)]

    moments = _plain(vmap(one))(stack(params), px, mask, torch.stack(betas))
    return [ClientBN([mb[c] for mb, _ in moments], [vb[c] for _, vb in moments]) for c in range(len(xs))]


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
    """`hypergrad.fomaml_gradient` for N clients in one vmapped second-order computation. `hyper(lam, xi, x)` ->
    (beta, eta) is the meta-nets' map (the same for every client; xi, x are each client's inputs). `eta_dirs`
    (--lr-grad trajectory): each client's summed fine-tuning gradient, the LRs' path into L_V
    (`hypergrad.fomaml_gradient`'s eta_step); `eta_slopes` (--lr-grad trajectory-bn): that path as per-tensor slopes
    (its eta_slope), which take its place."""
    n = len(lams)
    (lx, ly), lmask = _padded_batches(last)
    (vx, vy), vmask = _padded_batches(val)
    mean, var = stack_bn(bns)

    sloped = eta_slopes is not None
    traj = eta_dirs is not None and not sloped

    def meta_loss(lam: dict, xi: Tensor, xin: Tensor, theta: Params, x: Tensor, y: Tensor, m: Tensor, xv: Tensor,
                  yv: Tensor, mv: Tensor, cm: list[Tensor], cv: list[Tensor], ed: list[Tensor],
                  sl: Tensor) -> tuple[Tensor, tuple]:
        beta, eta = hyper(lam, xi, xin)
        inner_fn: Callable[[Params], Tensor] = lambda th: masked_ce(  # noqa: E731
            model, th, x, y, m, MaskedPolicy(beta, train=True, mask=m))
        g, inner = grad_and_value(inner_fn)(theta)  # one forward for the loss and its gradient
        if sloped:  # the LRs' path comes in as slopes, a linear term of value 0 (hypergrad.fomaml_gradient's eta_slope)
            stepped = {k: v - e.detach() * g[k] for (k, v), e in zip(theta.items(), eta)}
            lv = masked_ce(model, stepped, xv, yv, mv, _val_policy(beta, mv, cm, cv, val_stats))
            return lv + (eta * sl.detach()).sum(), (lv.detach(), inner.detach())
        if traj:  # the LRs move theta* along -sum of the run's gradients: first order, a straight line from theta_g
            stepped = {k: v - e.detach() * g[k] - (e - e.detach()) * d.detach()
                       for (k, v), e, d in zip(theta.items(), eta, ed)}
        else:
            stepped = {k: v - e * g[k] for (k, v), e in zip(theta.items(), eta)}
        lv = masked_ce(model, stepped, xv, yv, mv, _val_policy(beta, mv, cm, cv, val_stats))
        return lv, (lv.detach(), inner.detach())

    with torch.no_grad():  # builds the meta-nets' module templates (initialised, i.e. drawn) outside vmap
        hyper(lams[0], *inputs[0])
    xi = torch.stack([i[0] for i in inputs])
    xin = torch.stack([i[1] for i in inputs])
    eds = ([torch.stack([d[k] for d in eta_dirs]) for k in range(len(eta_dirs[0]))] if traj and eta_dirs is not None
           else [torch.zeros(n, device=xi.device)])
    sls = torch.stack(eta_slopes) if eta_slopes is not None else torch.zeros(n, device=xi.device)
    g, (lv, lt) = _plain(vmap(grad(meta_loss, has_aux=True)))(stack(lams), xi, xin, stack(prev), lx, ly, lmask, vx, vy, vmask,
                                                      mean, var, eds, sls)
    return FomamlOut(unstack(g, n), lv, lt)


def _padded_batches(batches: list[tuple[Tensor, Tensor]]) -> tuple[tuple[Tensor, Tensor], Tensor]:
    x, y = pad_data([b[0] for b in batches], [b[1] for b in batches])
    mask = torch.stack([torch.arange(x.shape[1], device=x.device) < len(b[1]) for b in batches]).to(x.dtype)
    return (x, y), mask


def val_batches(ys: list[Tensor], batch_size: int, gens: list[torch.Generator]) -> list[Tensor]:
    """Each client's validation batch, drawn as `meta_gradient` draws it."""
    return [random_batch(len(y), batch_size, g) for y, g in zip(ys, gens)]


def _val_policy(beta: Tensor, mask: Tensor, mean: list[Tensor], var: list[Tensor], val_stats: str) -> BNPolicy:
    """The validation loss's BN: the client's statistics mixed by beta, or (test-batch) the batch's own."""
    if val_stats == "test-batch":
        return MaskedPolicy(beta, train=False, mask=mask)
    return inference_policy(beta, ClientBN(mean, var), val_stats)


@dataclass
class IftSettings:
    """`hypergrad.ift_hypergradient`'s options, as `algorithms.fedl2p.meta_gradient` passes them."""
    q: int = 3
    psi: float = 0.1
    scale_by_psi: bool = False
    hessian: str = "exact"
    psi_power: int = 0
    last_step: bool = False  # L_T at theta_train (the weights before the last step), with its batch and gradient
    eta_step: bool = False   # --eta-grad last-step: the LRs' gradient through the last step
    val_stats: str = "running"


def ift_many(model: nn.Module, hyper: Callable[[dict, Tensor, Tensor], tuple[Tensor, Tensor]],
             lams: list[dict[str, Tensor]], inputs: list[tuple[Tensor, Tensor]], theta_star: list[Params],
             theta_train: list[Params], inner_grads: list[list[Tensor]], train: list[tuple[Tensor, Tensor]],
             val: list[tuple[Tensor, Tensor]], bns: list[ClientBN], s: IftSettings,
             eta_dirs: list[list[Tensor]] | None = None, eta_slopes: list[Tensor] | None = None) -> FomamlOut:
    """`hypergrad.ift_hypergradient` for N clients in one vmapped computation: the Hessian-vector products are
    `torch.func.vjp`s of the training loss's gradient, the Krylov basis and Neumann series are per client. With
    `s.last_step` theta_train and inner_grads are the weights before the last step and that step's gradient (else
    theta_train is theta_star); `s.eta_step` reads `eta_dirs` (--lr-grad trajectory: the summed gradients), else
    `inner_grads` (the last step's gradient), unless `eta_slopes` gives that path's per-tensor slopes."""
    from .hypergrad import PSI_MARGIN, krylov, neumann_coefficients, spectral_radius_estimate
    n = len(lams)
    (tx, ty), tmask = _padded_batches(train)
    (vx, vy), vmask = _padded_batches(val)
    mean, var = stack_bn(bns)
    exact, m = s.hessian == "exact", max(s.q, s.psi_power)

    def one(lam: dict, xi: Tensor, xin: Tensor, th_v: Params, th_t: Params, ig: list[Tensor], ed: list[Tensor],
            sl: Tensor, x: Tensor, y: Tensor, mk: Tensor, xv: Tensor, yv: Tensor, mv: Tensor, cm: list[Tensor],
            cv: list[Tensor]) -> tuple[dict[str, Tensor], Tensor, Tensor, Tensor]:
        def lv_fn(th: Params, lm: dict) -> Tensor:
            beta, _ = hyper(lm, xi, xin)
            return masked_ce(model, th, xv, yv, mv, _val_policy(beta, mv, cm, cv, s.val_stats))

        (v, direct), lv = grad_and_value(lv_fn, argnums=(0, 1))(th_v, lam)

        def lt_fn(th: Params, lm: dict) -> Tensor:
            beta, eta = hyper(lm, xi, xin)
            eta = eta.detach() if s.eta_step else eta
            if exact or not s.last_step:
                b_in = beta if exact else beta.detach()
                inner = lambda t: masked_ce(model, t, x, y, mk, MaskedPolicy(b_in, train=True, mask=mk))  # noqa: E731
                at = th if exact else {k: t.detach() for k, t in th.items()}
                g = grad(inner)(at)
                g = g if exact else {k: t.detach() for k, t in g.items()}
            else:
                g = {k: t.detach() for k, t in zip(th, ig)}
            stepped = {k: t - e * g[k] for (k, t), e in zip(th.items(), eta)}
            return masked_ce(model, stepped, x, y, mk, MaskedPolicy(beta, train=True, mask=mk))

        # L_T's value comes with the gradient whose vector-Jacobian products are the Hessian's (no forward twice)
        _, products, lt = cast(tuple[Any, Callable, Tensor],
                               vjp(lambda th, lm: grad_and_value(lt_fn)(th, lm), th_t, lam, has_aux=True))
        keys = list(th_t)
        v0 = [v[k].detach() for k in keys]

        def hvp(u: list[Tensor]) -> list[Tensor]:  # one vjp per product (not one per tensor)
            out = products(dict(zip(keys, u)))[0]
            return [out[k] for k in keys]

        basis, h, norm = krylov(hvp, v0, m)
        psi_t = h.new_tensor(s.psi)
        if s.psi_power > 0:
            psi_t = (PSI_MARGIN / spectral_radius_estimate(h).clamp_min(1e-12)).clamp_max(s.psi)
        c = (norm * neumann_coefficients(h, psi_t, s.q) * (psi_t if s.scale_by_psi else 1.0)).to(v0[0].dtype)
        p = [sum(c[i] * b[k] for i, b in enumerate(basis)) for k in range(len(keys))]
        if s.eta_step:  # the LRs' path into L_V through the last step (hypergrad.ift_hypergradient's eta_step)
            d_eta = sl if eta_slopes is not None else torch.stack([-(a * b).sum() for a, b in zip(v0, ed)])
            eta_vjp = vjp(lambda lm: hyper(lm, xi, xin)[1], lam)[1]
            direct = {k: direct[k] + d for k, d in eta_vjp(d_eta)[0].items()}
        mixed = products(dict(zip(keys, p)))[1]
        return {k: direct[k] - mixed[k] for k in lam}, lv.detach(), lt.detach(), psi_t

    with torch.no_grad():  # builds the meta-nets' module templates outside vmap
        hyper(lams[0], *inputs[0])
    xi = torch.stack([i[0] for i in inputs])
    xin = torch.stack([i[1] for i in inputs])
    igs = [torch.stack([g[k] for g in inner_grads]) for k in range(len(inner_grads[0]))]
    eds = igs if eta_dirs is None else [torch.stack([d[k] for d in eta_dirs]) for k in range(len(eta_dirs[0]))]
    sls = torch.stack(eta_slopes) if eta_slopes is not None else torch.zeros(n, device=xi.device)
    g, lv, lt, psi = _plain(vmap(one))(stack(lams), xi, xin, stack(theta_star), stack(theta_train), igs, eds, sls, tx, ty,
                                       tmask, vx, vy, vmask, mean, var)
    return FomamlOut(unstack(g, n), lv, lt, psi)


def _perfedavg_step_fn(model: nn.Module, alpha: float) -> Callable:
    """One client's Per-FedAvg (HF) step on its three batches (`algorithms.local.perfedavg_hf_step`): the new weights,
    the running statistics moved by the step's three training-mode forwards (D, D', D'' in that order, as the
    module's own BN moves them) and the first batch's loss; vmapped over clients by `perfedavg_many`."""
    def loss_fn(p: Params, x: Tensor, y: Tensor, mask: Tensor) -> tuple[Tensor, tuple]:
        pol = MaskedPolicy(None, train=True, mask=mask)  # every BN layer on its batch's statistics
        loss = masked_ce(model, p, x, y, mask, pol)
        return loss, (loss.detach(), [pol.moments[i] for i in sorted(pol.moments)])

    def step(p: Params, mean: list[Tensor], var: list[Tensor], x: Tensor, y: Tensor, mask: Tensor, lr: Tensor,
             active: Tensor) -> tuple[Params, list[Tensor], list[Tensor], Tensor]:
        g1, (loss, m1) = grad(loss_fn, has_aux=True)(p, x[0], y[0], mask[0])
        tmp = {k: v - alpha * g1[k] for k, v in p.items()}
        g2, (_, m2) = grad(loss_fn, has_aux=True)(tmp, x[1], y[1], mask[1])
        g3 = lambda w: grad(loss_fn, has_aux=True)(w, x[2], y[2], mask[2])  # noqa: E731
        _, hvp, (_, m3) = cast(tuple[Any, Callable, tuple], vjp(g3, p, has_aux=True))  # torch types 2 of its 3
        hv = hvp(g2)[0]  # H(w; D'') g2, one vector-Jacobian product of the gradient (H is symmetric)
        new = {k: torch.where(active, v - lr * (g2[k] - alpha * hv[k]), v) for k, v in p.items()}
        for moments in (m1, m2, m3):
            mean, var = _moved(mean, var, moments, active)
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
        logits = forward(model, p, xb, BNPolicy(beta, cm, cv, train=False))
        loss = torch.where(mb, F.cross_entropy(logits, yb, reduction="none").double(), 0.0)
        return torch.stack([loss.sum(), ((logits.argmax(1) == yb) & mb).double().sum()])
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
