"""Meta-gradients of the validation loss w.r.t. lambda: IFT with a Neumann series (Alg. 2) and FOMAML+.

Training loss for the IFT (Eq. 9-10), on one train batch (x, y):
    L_T(theta, lambda) = CE(f_{theta', beta}(x), y),  theta' = theta - eta * grad_theta CE(f_{theta, beta}(x), y)
Validation loss: L_V(theta, lambda) = CE(f_{theta, beta}(x_v), y_v) with evaluation-mode BN mixing.
Hypergradient at the fine-tuned theta*:
    v = p = dL_V/dtheta;  Q times: v <- v - psi * H_T v,  p <- p + v;   g = dL_V/dlambda - p . d2L_T/dlambda dtheta
The paper's Alg. 2 returns p unscaled; Lorraine et al. multiply it by psi (then p -> H^-1 v as Q grows):
`scale_by_psi` selects that.

`hessian="exact"` differentiates Eq. 9-10 literally, so H_T v is third order (L_T contains a gradient).
`hessian="fo"` holds the inner gradient g = grad CE(theta) constant (in theta and beta; eta still multiplies it):
then dL_T/dtheta = grad CE(theta') and H_T = Hessian of CE at theta', second order and ~3x cheaper. The dropped
terms are O(eta): dtheta'/dtheta = I - eta H ~ I and dtheta'/dbeta = -eta dg/dbeta ~ 0 at fine-tuning LRs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, get_args

import torch
from torch import Tensor, nn

from .bn import BNPolicy
from .finetune import ClientBN, inference_policy
from .functional import Params, ce_loss
from .metanets import Lambda
from .settings import Hessian

HyperFn = Callable[[Lambda], tuple[Tensor, Tensor]]  # lambda -> (beta [B], eta [|P|])
Batch = tuple[Tensor, Tensor]


@dataclass
class MetaGrad:
    grads: Lambda
    val_loss: float
    train_loss: float
    psi: float = 0.0  # the Neumann step size the IFT used (0: FOMAML+, no series)


def _leaves(d: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().requires_grad_(True) for k, v in d.items()}


def _grad(out: Tensor, inputs: list[Tensor], **kw) -> list[Tensor]:
    gs = torch.autograd.grad(out, inputs, allow_unused=True, **kw)
    return [torch.zeros_like(i) if g is None else g for g, i in zip(gs, inputs)]


HESSIANS = get_args(Hessian)
# psi_power's psi = PSI_MARGIN / lambda_max-estimate: a few power iterations from dL_V/dtheta underestimate lambda_max
# (measured on a tiny-store client: 1.07 after 5 iterations against 2.19), and the series converges only while
# psi * lambda_max < 2, so the margin keeps it convergent for estimates down to a quarter of the true value
PSI_MARGIN = 0.5


def train_loss(model: nn.Module, theta: Params, beta: Tensor, eta: Tensor, batch: Batch, hessian: str = "exact",
               inner_grad: list[Tensor] | None = None) -> Tensor:
    """Eq. 9-10: the loss after one in-graph step with per-tensor learning rates eta. With hessian="fo" the inner
    gradient is a constant; `inner_grad` supplies it when the caller already has it (the last fine-tuning step's)."""
    x, y = batch
    exact = hessian == "exact"
    if exact or inner_grad is None:
        at = theta if exact else {k: v.detach().requires_grad_(True) for k, v in theta.items()}
        inner = ce_loss(model, at, x, y, BNPolicy(beta if exact else beta.detach(), train=True))
        g = torch.autograd.grad(inner, list(at.values()), create_graph=exact)
    else:
        g = [t.detach() for t in inner_grad]
    stepped = {k: v - e * gk for (k, v), e, gk in zip(theta.items(), eta, g)}
    return ce_loss(model, stepped, x, y, BNPolicy(beta, train=True))


def val_loss(model: nn.Module, theta: Params, beta: Tensor, batch: Batch, bn: ClientBN, stats: str = "running") -> Tensor:
    """Evaluation-mode BN as at test time (`inference_policy`: the client's statistics, or the batch's own)."""
    x, y = batch
    return ce_loss(model, theta, x, y, inference_policy(beta, bn, stats))


def top_eigenvalue(hvp: Callable[[list[Tensor]], list[Tensor]], v0: list[Tensor], iters: int) -> float:
    """Power iteration for the largest-magnitude eigenvalue of H (Rayleigh quotient), started from v0."""
    v, est = v0, 0.0
    for _ in range(iters):
        n = torch.sqrt(sum((a * a).sum() for a in v))
        if not torch.isfinite(n) or n == 0:
            break
        v = [a / n for a in v]
        hv = hvp(v)
        est = float(sum((a * b).sum() for a, b in zip(v, hv)))
        v = hv
    return abs(est)


def ift_hypergradient(model: nn.Module, theta_star: Params, lam: Lambda, hyper: HyperFn, train_batch: Batch,
                      val_batch: Batch, bn: ClientBN, q: int = 3, psi: float = 0.1,
                      scale_by_psi: bool = False, hessian: str = "exact", psi_power: int = 0,
                      theta_train: Params | None = None, inner_grad: list[Tensor] | None = None,
                      val_stats: str = "running", eta_step: list[Tensor] | None = None) -> MetaGrad:
    """Alg. 2 by reverse-mode Hessian-vector products on one double-backward graph of dL_T/dtheta.

    L_T's argument is theta_star unless `theta_train` is given: then L_T(theta_train) is differentiated (the
    "last step" reading, theta_train = the parameters before the last fine-tuning step, so theta' = theta_star) while
    L_V is taken at theta_star; `inner_grad` (fo only) is that step's gradient, saving its forward-backward.

    psi_power > 0 (the default; not in the paper): estimate H_T's top eigenvalue by that many power iterations from
    dL_V/dtheta and use psi = min(psi, PSI_MARGIN/lambda_max). The series v <- (I - psi H) v diverges once psi * lambda_max > 2;
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
    lt = train_loss(model, theta, beta, eta if eta_step is None else eta.detach(), train_batch, hessian, inner_grad)
    g_t = torch.autograd.grad(lt, th, create_graph=True)
    hvp = lambda u: _grad(g_t, th, grad_outputs=u, retain_graph=True)  # noqa: E731
    if psi_power > 0:
        psi = min(psi, PSI_MARGIN / max(top_eigenvalue(hvp, [t.detach() for t in v], psi_power), 1e-12))
    p = [t.clone() for t in v]
    for _ in range(q):
        hv = hvp(v)
        v = [a - psi * b for a, b in zip(v, hv)]
        p = [a + b for a, b in zip(p, v)]
    if scale_by_psi:
        p = [psi * a for a in p]
    if eta_step is not None and eta.requires_grad:  # d theta_star / d eta_k = -g_k: the LRs' path into L_V, through the last step
        d_eta = torch.stack([-(a * b).sum() for a, b in zip(v0, eta_step)])
        direct = [a + b for a, b in zip(direct, _grad(eta, lm, grad_outputs=d_eta, retain_graph=True))]
    mixed = _grad(g_t, lm, grad_outputs=p)
    grads = {k: d - m for k, d, m in zip(lam_l, direct, mixed)}
    return MetaGrad(grads, lv.item(), lt.item(), psi)


def fomaml_gradient(model: nn.Module, theta_prev: Params, lam: Lambda, hyper: HyperFn, last_batch: Batch,
                    val_batch: Batch, bn: ClientBN, val_stats: str = "running") -> MetaGrad:
    """FOMAML+ (App. F): only the last fine-tuning step is differentiated, theta_prev held constant."""
    lam_l, theta = _leaves(lam), _leaves(theta_prev)
    beta, eta = hyper(lam_l)
    x, y = last_batch
    inner = ce_loss(model, theta, x, y, BNPolicy(beta, train=True))
    g = torch.autograd.grad(inner, list(theta.values()), create_graph=True)
    stepped = {k: v - e * gk for (k, v), e, gk in zip(theta.items(), eta, g)}
    lv = val_loss(model, stepped, beta, val_batch, bn, val_stats)
    grads = dict(zip(lam_l, _grad(lv, list(lam_l.values()))))
    return MetaGrad(grads, lv.item(), inner.item())
