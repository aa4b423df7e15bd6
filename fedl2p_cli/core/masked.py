"""Losses over a padded batch: a mask [N] of 0/1 marks the client's own samples, so a group of clients with ragged
batches is one stacked computation (`torch.func.vmap`) and each client's loss and BN batch moments are those of its
own samples. One client's computation takes mask None: the plain loss and BN, no padding."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.nn.functional as F
from torch import Tensor, nn

from .bn import BNPolicy, MixBN, _dims, _expand, normalize_with
from .functional import Params, ce_loss, forward


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
        w = expand_to(self.mask, x)
        count = self.mask.sum() * (x.numel() // (x.shape[0] * x.shape[1]))
        dims = _dims(x)
        mean_b = (x * w).sum(dims) / count.clamp_min(1)
        var_b = ((x - _expand(mean_b, x)).square() * w).sum(dims) / count.clamp_min(1)
        self.moments[m.bn_index] = (mean_b, var_b, count)
        return normalize_with(m, x, *self.mixed(m, mean_b, var_b))


def expand_to(v: Tensor, x: Tensor) -> Tensor:
    return v.view(-1, *([1] * (x.dim() - 1)))


def masked_ce(model: nn.Module, params: Params, x: Tensor, y: Tensor, mask: Tensor, pol: BNPolicy) -> Tensor:
    """Mean cross-entropy over the masked samples."""
    per = F.cross_entropy(forward(model, params, x, pol), y, reduction="none")
    return (per * mask).sum() / mask.sum().clamp_min(1)


def train_ce(model: nn.Module, params: Params, x: Tensor, y: Tensor, beta: Tensor, mask: Tensor | None = None) -> Tensor:
    """Cross-entropy under training-mode BN mixed by beta (Eq. 2 with the batch's statistics)."""
    if mask is None:
        return ce_loss(model, params, x, y, BNPolicy(beta, train=True))
    return masked_ce(model, params, x, y, mask, MaskedPolicy(beta, train=True, mask=mask))


def eval_ce(model: nn.Module, params: Params, x: Tensor, y: Tensor, pol: BNPolicy, beta: Tensor | None,
            mask: Tensor | None = None) -> Tensor:
    """Cross-entropy under the evaluation policy `pol`; a padded batch with batch statistics (`pol` without client
    statistics) takes them over its masked samples."""
    if mask is None:
        return ce_loss(model, params, x, y, pol)
    if pol.client_mean is None:
        pol = MaskedPolicy(beta, train=False, mask=mask)
    return masked_ce(model, params, x, y, mask, pol)
