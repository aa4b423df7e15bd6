"""Meta-gradients of the validation loss w.r.t. lambda: IFT with a Neumann series (Alg. 2) and FOMAML+.

Training loss for the IFT (Eq. 9-10), on one train batch (x, y):
    L_T(theta, lambda) = CE(f_{theta', beta}(x), y),  theta' = theta - eta * grad_theta CE(f_{theta, beta}(x), y)
Validation loss: L_V(theta, lambda) = CE(f_{theta, beta}(x_v), y_v) with evaluation-mode BN mixing.
Hypergradient at the fine-tuned theta*:
    v = p = dL_V/dtheta;  Q times: v <- v - psi * H_T v,  p <- p + v;   g = dL_V/dlambda - p . d2L_T/dlambda dtheta
The paper's Alg. 2 returns p unscaled; Lorraine et al. multiply it by psi (then p -> H^-1 v as Q grows):
`scale_by_psi` selects that. p is a polynomial of degree Q in H_T applied to v, so it is computed as a combination of an
orthonormal basis of the Krylov space {v, H_T v, .., H_T^Q v} (Arnoldi): the same Q products also estimate lambda_max.

`hessian="exact"` differentiates Eq. 9-10 literally, so H_T v is third order (L_T contains a gradient).
`hessian="fo"` holds the inner gradient g = grad CE(theta) constant (in theta and beta; eta still multiplies it):
then dL_T/dtheta = grad CE(theta') and H_T = Hessian of CE at theta', second order and ~3x cheaper. The dropped
terms are O(eta): dtheta'/dtheta = I - eta H ~ I and dtheta'/dbeta = -eta dg/dbeta ~ 0 at fine-tuning LRs.

Each meta-gradient is written once, as a function of one client's tensors (`fomaml_client`, `ift_client`), in
torch.func's style and in terms of a set of transforms (`core.autodiff`): one client runs it with `AUTOGRAD`
(`fomaml_gradient`, `ift_hypergradient`), a group of clients is `torch.func.vmap` of it with `FUNC` over padded,
masked batches (`core.batched.fomaml_many`, `ift_many`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from .autodiff import AUTOGRAD, Transforms
from .bn import BNPolicy
from .client import Batch
from .finetune import ClientBN, Replay, inference_policy
from .functional import Params, ce_loss
from .masked import eval_ce, train_ce
from .metanets import Lambda

HyperFn = Callable[[Lambda], tuple[Tensor, Tensor]]  # lambda -> (beta [B], eta [|P|])


@dataclass
class MetaGrad:
    """A client's meta-gradient, its losses and the Neumann step the IFT used (0: FOMAML+, no series). The values are
    floats, or 0-dim tensors on the device where a batched group reads them all when its update ends."""
    grads: Lambda
    val_loss: float | Tensor
    train_loss: float | Tensor
    psi: float | Tensor = 0.0


def _leaves(d: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().requires_grad_(True) for k, v in d.items()}


def _grad(out: Tensor | Sequence[Tensor], inputs: list[Tensor], **kw: Any) -> list[Tensor]:
    gs = torch.autograd.grad(out, inputs, allow_unused=True, **kw)
    return [torch.zeros_like(i) if g is None else g for g, i in zip(gs, inputs)]


# psi_power's psi = PSI_MARGIN / lambda_max-estimate. The series converges only while psi * lambda_max < 2, so the
# margin keeps it convergent for estimates down to a quarter of the true value; the Krylov estimate is never above it
PSI_MARGIN = 0.5
BREAKDOWN = 100  # Arnoldi: a residual below this many roundings of |H q| is no new direction


def train_loss(model: nn.Module, theta: Params, beta: Tensor, eta: Tensor, batch: Batch, hessian: str = "exact",
               inner_grad: list[Tensor] | None = None, mask: Tensor | None = None, d: Transforms = AUTOGRAD) -> Tensor:
    """Eq. 9-10: the loss after one in-graph step with per-tensor learning rates eta. With hessian="fo" the inner
    gradient is a constant; `inner_grad` supplies it when the caller already has it (the last fine-tuning step's).
    `mask`: a padded batch's own samples (`core.masked`); `d`: the transforms its inner gradient is taken by."""
    x, y = batch
    exact = hessian == "exact"
    if exact or inner_grad is None:
        at = theta if exact else {k: v.detach() for k, v in theta.items()}
        b_in = beta if exact else beta.detach()
        with d.nested():  # L_T is differentiated further: its inner gradient keeps its graph
            g = d.grad(lambda t: train_ce(model, t, x, y, b_in, mask))(at)
        g = g if exact else {k: v.detach() for k, v in g.items()}
    else:
        g = {k: t.detach() for k, t in zip(theta, inner_grad)}
    stepped = {k: v - e * g[k] for (k, v), e in zip(theta.items(), eta)}
    return train_ce(model, stepped, x, y, beta, mask)


def val_loss(model: nn.Module, theta: Params, beta: Tensor, batch: Batch, bn: ClientBN, stats: str = "running",
             mask: Tensor | None = None) -> Tensor:
    """Evaluation-mode BN as at test time (`inference_policy`: the client's statistics, or the batch's own)."""
    x, y = batch
    return eval_ce(model, theta, x, y, inference_policy(beta, bn, stats), beta, mask)


def _dot(a: list[Tensor], b: list[Tensor]) -> Tensor:
    return cast(Tensor, sum((x * y).sum() for x, y in zip(a, b)))


def krylov(hvp: Callable[[list[Tensor]], list[Tensor]], v: list[Tensor], m: int
           ) -> tuple[list[list[Tensor]], Tensor, Tensor]:
    """Arnoldi (Lanczos with full reorthogonalisation) from v, m products with H: an orthonormal basis q_0..q_m of
    {v, Hv, .., H^m v}, its (m+1) x m Hessenberg matrix h (float64) with H q_j = sum_i h[i, j] q_i, and |v|.
    Each vector is normalised as it is made, so nothing grows like lambda_max^k; two Gram-Schmidt passes keep the
    basis orthonormal ("twice is enough"). Where H q_j lies in the span already (to BREAKDOWN x rounding), q_{j+1} is
    zero and so is every later vector: the relation still holds. Every coefficient stays a tensor (no host sync), and
    h is built column by column without in-place writes, so the batched IFT (core.batched) vmaps this same code."""
    eps = torch.finfo(v[0].dtype).eps
    norm = torch.sqrt(_dot(v, v))
    basis = [[t * _inverse(norm, norm > 0) for t in v]]
    zero = norm.new_zeros((), dtype=torch.float64)
    cols = []
    for j in range(m):
        w = hvp(basis[j])
        scale = torch.sqrt(_dot(w, w))
        coef = [zero] * len(basis)
        for _ in range(2):
            for i, q in enumerate(basis):
                c = _dot(q, w)
                coef[i] = coef[i] + c.double()  # summed in float64
                w = [a - c * b for a, b in zip(w, q)]
        beta = torch.sqrt(_dot(w, w))
        new = beta > BREAKDOWN * eps * scale
        cols.append(torch.stack(coef + [torch.where(new, beta, 0.0).double()] + [zero] * (m - j - 1)))
        basis.append([a * _inverse(beta, new) for a in w])
    h = torch.stack(cols, 1) if cols else norm.new_zeros(1, 0, dtype=torch.float64)
    return basis, h, norm


def _inverse(x: Tensor, ok: Tensor) -> Tensor:
    return torch.where(ok, 1 / torch.where(ok, x, 1.0), 0.0)


def spectral_radius_estimate(h: Tensor) -> Tensor:
    """max |Ritz value| of H on the Krylov space of Arnoldi's h ((m+1) x m): Rayleigh-Ritz, so never above max |eig H|
    (up to rounding), and for the same products never below the power iteration's Rayleigh quotient."""
    m = h.shape[1]
    if m == 0:
        return h.new_zeros(())
    t = h[:m, :m]
    finite = torch.isfinite(t).all()  # a diverged fine-tuning: NaN on to the meta-gradient, which reports it
    est = torch.linalg.eigvalsh(torch.where(finite, (t + t.T) / 2, 0.0)).abs().max()
    return torch.where(finite, est, float("nan"))


def neumann_coefficients(h: Tensor, psi: Tensor, q: int) -> Tensor:
    """c with sum_{k<=q} (I - psi H)^k q_0 = sum_i c_i q_i, for q <= m: H^k q_0 = Q_{m+1} H_sq^k e_1 with H_sq the
    Hessenberg matrix padded by a zero column (the product that column would need never enters a degree <= m)."""
    m = h.shape[1]
    assert q <= m, (q, m)
    hs = torch.cat([h, h.new_zeros(m + 1, 1)], dim=1)
    u = h.new_zeros(m + 1)
    u[0] = 1.0
    c = u.clone()
    for _ in range(q):
        u = u - psi * (hs @ u)
        c = c + u
    return c


@dataclass(frozen=True)
class IftSettings:
    """The IFT's options (`ift_hypergradient`'s, as `algorithms.meta_grads.Ift` passes them)."""
    q: int = 3
    psi: float = 0.1
    scale_by_psi: bool = False
    hessian: str = "exact"
    psi_power: int = 0
    val_stats: str = "running"


def ift_client(d: Transforms, model: nn.Module, hyper: HyperFn, lam: Lambda, theta_star: Params, train: Batch,
               val: Batch, bn: ClientBN, s: IftSettings, theta_train: Params | None = None,
               inner_grad: list[Tensor] | None = None, path: list[Tensor] | None = None, slope: Tensor | None = None,
               train_mask: Tensor | None = None, val_mask: Tensor | None = None
               ) -> tuple[dict[str, Tensor], Tensor, Tensor, Tensor]:
    """One client's IFT meta-gradient (`ift_hypergradient`), its validation and training losses and its Neumann step,
    by the transforms `d`. The Hessian-vector products are vector-Jacobian products of L_T's gradient (one graph,
    its forward once); `path`/`slope` are `ift_hypergradient`'s eta_step/eta_slope."""
    sloped = path is not None or slope is not None
    th_t = theta_star if theta_train is None else theta_train

    def lv_fn(th: Params, lm: Lambda) -> Tensor:
        return val_loss(model, th, hyper(lm)[0], val, bn, s.val_stats, val_mask)

    (v, direct), lv = d.grad_and_value(lv_fn, argnums=(0, 1))(theta_star, lam)

    def lt_fn(th: Params, lm: Lambda) -> Tensor:
        beta, eta = hyper(lm)
        return train_loss(model, th, beta, eta.detach() if sloped else eta, train, s.hessian, inner_grad, train_mask, d)

    # L_T's value comes with the gradient whose vector-Jacobian products are the Hessian's (no forward twice)
    _, products, lt = cast(tuple[Any, Callable, Tensor],
                           d.vjp(lambda th, lm: d.grad_and_value(lt_fn)(th, lm), th_t, lam, has_aux=True))
    keys = list(th_t)
    v0 = [v[k].detach() for k in keys]

    def hvp(u: list[Tensor]) -> list[Tensor]:  # one product w.r.t. theta alone (not one per tensor)
        out = products(dict(zip(keys, u)), only=0)[0]
        return [out[k] for k in keys]

    basis, h, norm = krylov(hvp, v0, max(s.q, s.psi_power))  # every Hessian-vector product this makes
    psi_t = h.new_tensor(s.psi)
    if s.psi_power > 0:
        psi_t = (PSI_MARGIN / spectral_radius_estimate(h).clamp_min(1e-12)).clamp_max(s.psi)
    c = (norm * neumann_coefficients(h, psi_t, s.q) * (psi_t if s.scale_by_psi else 1.0)).to(v0[0].dtype)
    p = [sum(c[i] * b[k] for i, b in enumerate(basis)) for k in range(len(keys))]
    if sloped:  # d theta_star / d eta_k = -path_k: the LRs' path into L_V (the last step's, or the run's); or slopes
        d_eta = slope if slope is not None else torch.stack([-(a * b).sum() for a, b in zip(v0, path or [])])
        eta_vjp = d.vjp(lambda lm: hyper(lm)[1], lam)[1]
        direct = {k: direct[k] + g for k, g in eta_vjp(d_eta)[0].items()}
    mixed = products(dict(zip(keys, p)), only=1)[1]
    return {k: direct[k] - mixed[k] for k in lam}, lv.detach(), lt.detach(), psi_t


def ift_hypergradient(model: nn.Module, theta_star: Params, lam: Lambda, hyper: HyperFn, train_batch: Batch,
                      val_batch: Batch, bn: ClientBN, q: int = 3, psi: float = 0.1,
                      scale_by_psi: bool = False, hessian: str = "exact", psi_power: int = 0,
                      theta_train: Params | None = None, inner_grad: list[Tensor] | None = None,
                      val_stats: str = "running", eta_step: list[Tensor] | None = None,
                      eta_slope: Tensor | None = None) -> MetaGrad:
    """Alg. 2 by reverse-mode Hessian-vector products on one double-backward graph of dL_T/dtheta (`ift_client`,
    one client, by torch.autograd).

    L_T's argument is theta_star unless `theta_train` is given: then L_T(theta_train) is differentiated (the
    "last step" reading, theta_train = the parameters before the last fine-tuning step, so theta' = theta_star) while
    L_V is taken at theta_star; `inner_grad` (fo only) is that step's gradient, saving its forward-backward.

    The Hessian-vector products: max(q, psi_power), once, from v = dL_V/dtheta (`krylov`); then the mixed product.
    psi_power = N > 0 (the default, N = Q; not in the paper): psi = min(psi, PSI_MARGIN/lambda_max), lambda_max the
    largest |Ritz value| on that Krylov space (N > Q buys a better estimate for N - Q more products; the series
    reuses the first Q). The series v <- (I - psi H) v diverges once psi * lambda_max > 2;
    measured on small-cnn clients lambda_max is 60-560, so the paper's psi = 0.1 multiplies v by up to ~55 per term and,
    with Q = 3 (odd), the top eigendirection's term 1 + (1-a) + (1-a)^2 + (1-a)^3 (a = psi * lambda_max) is large and
    negative: the eta~ hypergradient then says "raise every LR" for every tensor, and eta~ runs away at the clip.

    eta_step (the `--eta-grad last-step` default; not in the paper): the last fine-tuning step's gradient g, so that
    theta_star = theta_prev - eta * g. The learned LRs then get dL_V/deta through that step, -dL_V/dtheta . g per
    tensor (FOMAML+'s LR gradient), and the implicit term only for beta: the IFT assumes theta_star is a stationary
    point of L_T, which an LR does not move, so its LR term is only the bias of an unconverged theta_star (converged,
    it is +dL_V/dtheta . dL_T/dtheta: it lowers every LR whenever training and validation gradients agree)."""
    s = IftSettings(q, psi, scale_by_psi, hessian, psi_power, val_stats)
    grads, lv, lt, psi_t = ift_client(AUTOGRAD, model, hyper, lam, theta_star, train_batch, val_batch, bn, s,
                                      theta_train, inner_grad, eta_step, eta_slope)
    return MetaGrad(grads, lv.item(), lt.item(), float(psi_t))


def lr_slope_bn(model: nn.Module, theta_star: Params, beta: Tensor, val_batch: Batch, x_train: Tensor,
                grad_sum: list[Tensor], val_stats: str = "running") -> Tensor:
    """--lr-grad trajectory-bn: dL_V/deta_k = -dL_V/dtheta*_k . grad_sum_k (the trajectory estimate) with dL_V/dtheta*
    taken through the client's BN statistics too, recomputed from theta* as evaluation recomputes them (PreciseBN,
    `finetune.precise_bn_path`), where the trajectory estimate holds them. One full-batch forward-backward over the
    client's training data more; a [|P|] vector of per-tensor slopes (the LRs' path, handed to the meta-gradient)."""
    from .finetune import precise_bn_path
    th = _leaves(theta_star)
    b = beta.detach()
    bn = precise_bn_path(model, th, x_train, b) if val_stats == "running" else ClientBN([], [])  # test-batch: unused
    lv = ce_loss(model, th, *val_batch, inference_policy(b, bn, val_stats))
    v = _grad(lv, list(th.values()))
    return torch.stack([-(a * d).sum() for a, d in zip(v, grad_sum)])


def lr_slope_unrolled(model: nn.Module, replay: Replay, beta: Tensor, val_batch: Batch,
                      val_stats: str = "running") -> Tensor:
    """--lr-grad unrolled: dL_V/deta_k exactly, by reverse mode through every fine-tuning step (each step's gradient
    taken with create_graph) and through the client's statistics recomputed from theta* (PreciseBN), as evaluation
    recomputes them. Where `lr_slope_bn` takes the summed gradient as the path (exact only while the gradients along
    the way do not depend on the LRs), this differentiates the steps themselves, so it stays exact at a trained lambda.
    Memory grows with the number of steps (the graph of every step is held); a [|P|] vector of per-tensor slopes."""
    from .finetune import precise_bn_path
    b = beta.detach()
    eta = replay.lr.detach().clone().requires_grad_(True)
    theta = _leaves(replay.start)
    for idx in replay.batches:
        loss = ce_loss(model, theta, replay.x[idx], replay.y[idx], BNPolicy(b, train=True))
        g = torch.autograd.grad(loss, list(theta.values()), create_graph=True)
        theta = {k: v - e * gk for (k, v), e, gk in zip(theta.items(), eta, g)}
    bn = precise_bn_path(model, theta, replay.x, b) if val_stats == "running" else ClientBN([], [])  # test-batch: unused
    lv = ce_loss(model, theta, *val_batch, inference_policy(b, bn, val_stats))
    return torch.autograd.grad(lv, eta)[0]


def fomaml_client(d: Transforms, model: nn.Module, hyper: HyperFn, lam: Lambda, theta_prev: Params, last: Batch,
                  val: Batch, bn: ClientBN, val_stats: str = "running", path: list[Tensor] | None = None,
                  slope: Tensor | None = None, last_mask: Tensor | None = None, val_mask: Tensor | None = None
                  ) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """One client's FOMAML+ meta-gradient (`fomaml_gradient`) and its validation and training losses, by the
    transforms `d`; `path`/`slope` are `fomaml_gradient`'s eta_step/eta_slope."""
    def meta_loss(lm: Lambda) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        beta, eta = hyper(lm)
        # one forward for the last step's loss and its gradient, theta_prev held constant
        g, inner = d.grad_and_value(lambda th: train_ce(model, th, *last, beta, last_mask))(theta_prev)
        if slope is not None:  # the LRs' path comes in as slopes: none through the last step
            stepped = {k: v - e.detach() * g[k] for (k, v), e in zip(theta_prev.items(), eta)}
        elif path is None:
            stepped = {k: v - e * g[k] for (k, v), e in zip(theta_prev.items(), eta)}
        else:  # value theta*, LR gradient along the summed path (the second term is 0 in value)
            stepped = {k: v - e.detach() * g[k] - (e - e.detach()) * p.detach()
                       for (k, v), e, p in zip(theta_prev.items(), eta, path)}
        lv = val_loss(model, stepped, beta, val, bn, val_stats, val_mask)
        # the slopes enter as a linear term: its gradient is eta's vector-Jacobian product with them, its value 0 to L_V
        objective = lv if slope is None else lv + (eta * slope.detach()).sum()
        return objective, (lv.detach(), inner.detach())

    grads, (lv, lt) = d.grad(meta_loss, has_aux=True)(lam)
    return grads, lv, lt


def fomaml_gradient(model: nn.Module, theta_prev: Params, lam: Lambda, hyper: HyperFn, last_batch: Batch,
                    val_batch: Batch, bn: ClientBN, val_stats: str = "running",
                    eta_step: list[Tensor] | None = None, eta_slope: Tensor | None = None) -> MetaGrad:
    """FOMAML+ (App. F): only the last fine-tuning step is differentiated, theta_prev held constant (`fomaml_client`,
    one client, by torch.autograd).

    eta_step (--lr-grad trajectory; not in the paper): the fine-tuning's gradients summed, so that theta* = theta_g -
    eta * eta_step (constant LRs). The LRs then reach L_V along that whole path, dL_V/deta_k = -dL_V/dtheta*_k .
    eta_step_k, i.e. dL_V/dlog eta_k = dL_V/dtheta*_k . (theta*_k - theta_g,k), in place of the last step's
    -dL_V/dtheta*_k . g_k (1/steps of it when the gradients agree); beta keeps its last-step path.
    eta_slope (--lr-grad trajectory-bn): the LRs' path given as per-tensor slopes dL_V/deta (`lr_slope_bn`)."""
    grads, lv, lt = fomaml_client(AUTOGRAD, model, hyper, lam, theta_prev, last_batch, val_batch, bn, val_stats,
                                  eta_step, eta_slope)
    return MetaGrad(grads, lv.item(), lt.item())
