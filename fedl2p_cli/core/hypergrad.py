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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from .bn import BNPolicy
from .client import Batch
from .finetune import ClientBN, Replay, inference_policy
from .functional import Params, ce_loss
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
               inner_grad: list[Tensor] | None = None) -> Tensor:
    """Eq. 9-10: the loss after one in-graph step with per-tensor learning rates eta. With hessian="fo" the inner
    gradient is a constant; `inner_grad` supplies it when the caller already has it (the last fine-tuning step's)."""
    x, y = batch
    exact = hessian == "exact"
    if exact or inner_grad is None:
        at = theta if exact else {k: v.detach().requires_grad_(True) for k, v in theta.items()}
        inner = ce_loss(model, at, x, y, BNPolicy(beta if exact else beta.detach(), train=True))
        g: Sequence[Tensor] = torch.autograd.grad(inner, list(at.values()), create_graph=exact)
    else:
        g = [t.detach() for t in inner_grad]
    stepped = {k: v - e * gk for (k, v), e, gk in zip(theta.items(), eta, g)}
    return ce_loss(model, stepped, x, y, BNPolicy(beta, train=True))


def val_loss(model: nn.Module, theta: Params, beta: Tensor, batch: Batch, bn: ClientBN, stats: str = "running") -> Tensor:
    """Evaluation-mode BN as at test time (`inference_policy`: the client's statistics, or the batch's own)."""
    x, y = batch
    return ce_loss(model, theta, x, y, inference_policy(beta, bn, stats))


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


def ift_hypergradient(model: nn.Module, theta_star: Params, lam: Lambda, hyper: HyperFn, train_batch: Batch,
                      val_batch: Batch, bn: ClientBN, q: int = 3, psi: float = 0.1,
                      scale_by_psi: bool = False, hessian: str = "exact", psi_power: int = 0,
                      theta_train: Params | None = None, inner_grad: list[Tensor] | None = None,
                      val_stats: str = "running", eta_step: list[Tensor] | None = None,
                      eta_slope: Tensor | None = None) -> MetaGrad:
    """Alg. 2 by reverse-mode Hessian-vector products on one double-backward graph of dL_T/dtheta.

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
    lam_l, theta_v = _leaves(lam), _leaves(theta_star)
    theta = theta_v if theta_train is None else _leaves(theta_train)
    th, lm = list(theta.values()), list(lam_l.values())
    beta, eta = hyper(lam_l)
    lv = val_loss(model, theta_v, beta, val_batch, bn, val_stats)
    g_all = _grad(lv, list(theta_v.values()) + lm, retain_graph=True)
    v, direct = g_all[:len(th)], g_all[len(th):]
    v0 = [t.detach() for t in v]
    lt = train_loss(model, theta, beta, eta if eta_step is None and eta_slope is None else eta.detach(), train_batch,
                    hessian, inner_grad)
    g_t = torch.autograd.grad(lt, th, create_graph=True)
    hvp = lambda u: _grad(g_t, th, grad_outputs=u, retain_graph=True)  # noqa: E731
    basis, h, norm = krylov(hvp, v0, max(q, psi_power))  # every Hessian-vector product this makes
    psi_t = h.new_tensor(psi)
    if psi_power > 0:
        psi_t = (PSI_MARGIN / spectral_radius_estimate(h).clamp_min(1e-12)).clamp_max(psi)
    c = norm * neumann_coefficients(h, psi_t, q) * (psi_t if scale_by_psi else 1.0)
    c = c.to(v0[0].dtype)
    p = [sum(c[i] * b[k] for i, b in enumerate(basis)) for k in range(len(th))]
    if (eta_step is not None or eta_slope is not None) and eta.requires_grad:
        # d theta_star / d eta_k = -g_k: the LRs' path into L_V (the last step's, or the run's); or given as slopes
        d_eta = eta_slope if eta_slope is not None else torch.stack([-(a * b).sum() for a, b in zip(v0, eta_step or [])])
        direct = [a + b for a, b in zip(direct, _grad(eta, lm, grad_outputs=d_eta, retain_graph=True))]
    mixed = _grad(g_t, lm, grad_outputs=p)
    grads = {k: d - m for k, d, m in zip(lam_l, direct, mixed)}
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


def fomaml_gradient(model: nn.Module, theta_prev: Params, lam: Lambda, hyper: HyperFn, last_batch: Batch,
                    val_batch: Batch, bn: ClientBN, val_stats: str = "running",
                    eta_step: list[Tensor] | None = None, eta_slope: Tensor | None = None) -> MetaGrad:
    """FOMAML+ (App. F): only the last fine-tuning step is differentiated, theta_prev held constant.

    eta_step (--lr-grad trajectory; not in the paper): the fine-tuning's gradients summed, so that theta* = theta_g -
    eta * eta_step (constant LRs). The LRs then reach L_V along that whole path, dL_V/deta_k = -dL_V/dtheta*_k .
    eta_step_k, i.e. dL_V/dlog eta_k = dL_V/dtheta*_k . (theta*_k - theta_g,k), in place of the last step's
    -dL_V/dtheta*_k . g_k (1/steps of it when the gradients agree); beta keeps its last-step path.
    eta_slope (--lr-grad trajectory-bn): the LRs' path given as per-tensor slopes dL_V/deta (`lr_slope_bn`)."""
    lam_l, theta = _leaves(lam), _leaves(theta_prev)
    beta, eta = hyper(lam_l)
    x, y = last_batch
    inner = ce_loss(model, theta, x, y, BNPolicy(beta, train=True))
    g = torch.autograd.grad(inner, list(theta.values()), create_graph=True)
    if eta_slope is not None:  # the LRs' path comes in as slopes: none through the last step
        stepped = {k: v - e.detach() * gk for (k, v), e, gk in zip(theta.items(), eta, g)}
    elif eta_step is None:
        stepped = {k: v - e * gk for (k, v), e, gk in zip(theta.items(), eta, g)}
    else:  # value theta*, LR gradient along the summed path (the second term is 0 in value)
        stepped = {k: v - e.detach() * gk - (e - e.detach()) * d.detach()
                   for (k, v), e, gk, d in zip(theta.items(), eta, g, eta_step)}
    lv = val_loss(model, stepped, beta, val_batch, bn, val_stats)
    # the slopes enter as a linear term: its gradient is eta's vector-Jacobian product with them, its value 0 to L_V
    objective = lv if eta_slope is None else lv + (eta * eta_slope.detach()).sum()
    grads = dict(zip(lam_l, _grad(objective, list(lam_l.values()))))
    return MetaGrad(grads, lv.item(), inner.item())
