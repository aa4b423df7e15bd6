"""One client's Per-FedAvg (HF) step (Fallah et al. 2020), written once: `algorithms.local.perfedavg_hf_step` runs it
for one client by torch.autograd, `core.batched.perfedavg_many` vmaps it over a group by torch.func."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from torch import Tensor, nn

from .autodiff import Transforms
from .functional import Params, ce_loss
from .masked import MaskedPolicy, masked_ce

BatchMoments = list[tuple[Tensor, Tensor, Tensor]]  # per BN layer: batch mean, biased variance, count


def perfedavg_step(d: Transforms, model: nn.Module, params: Params, x: Sequence[Tensor] | Tensor,
                   y: Sequence[Tensor] | Tensor, alpha: float, lr: Tensor | float, mask: Tensor | None = None
                   ) -> tuple[Params, Tensor, list[BatchMoments]]:
    """w_tmp = w - alpha grad f(w; D);  w <- w - lr (I - alpha H(w; D'')) grad f(w_tmp; D'), on the batches
    (x[i], y[i]) for i = 0, 1, 2 (D, D', D''). The new weights, the first batch's loss and, for a padded group
    (`mask` [3, B]), each forward's BN batch moments in order (D, D', D''), from which the caller moves the running
    statistics; one client (mask None) normalises as the module's own BN does, which moves them itself."""
    def loss_fn(w: Params, i: int) -> tuple[Tensor, tuple[Tensor, BatchMoments]]:
        if mask is None:
            loss = ce_loss(model, w, x[i], y[i])
            return loss, (loss.detach(), [])
        pol = MaskedPolicy(None, train=True, mask=mask[i])  # every BN layer on its batch's statistics
        loss = masked_ce(model, w, x[i], y[i], mask[i], pol)
        return loss, (loss.detach(), [pol.moments[j] for j in sorted(pol.moments)])

    g1, (loss, m1) = d.grad(loss_fn, has_aux=True)(params, 0)
    tmp = {k: v.detach() - alpha * g1[k] for k, v in params.items()}
    g2, (_, m2) = d.grad(loss_fn, has_aux=True)(tmp, 1)
    _, hvp, (_, m3) = cast(tuple[Any, Any, tuple], d.vjp(lambda w: d.grad(loss_fn, has_aux=True)(w, 2), params,
                                                         has_aux=True))
    hv = hvp(g2)[0]  # H(w; D'') g2, one vector-Jacobian product of the gradient (H is symmetric)
    new = {k: v.detach() - lr * (g2[k] - alpha * hv[k]) for k, v in params.items()}
    return new, loss, [m1, m2, m3]
