"""How the server combines a round's replies (`meta-train --aggregate NAME`): catalog entries of kind "aggregator",
registered like a server step (`registry.add_aggregator`). The built-ins: the paper's weighted mean, the robust
coordinate-wise median and trimmed mean, and `equal-norm`, which gives every client's change the same size so that a
low-loss kind of client is heard as well as a high-loss one (not in the paper)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.aggregate import equal_norm_average, robust_average
from ..protocols import Aggregator

if TYPE_CHECKING:
    from ..core.metanets import Lambda


@dataclass(frozen=True)
class Robust:
    """A rule of core.aggregate.robust_average over the replies (the sent lambda plays no part)."""
    name: str
    about: str

    def combine(self, sent: Lambda, lams: list[Lambda], weights: list[float]) -> Lambda:
        return robust_average(lams, weights, self.name)


@dataclass(frozen=True)
class EqualNorm:
    """sent + the weighted mean of the clients' changes, each rescaled to the round's median change norm
    (core.aggregate.equal_norm_average). Under the paper's mean a client's pull grows with its gradient, so the kind
    with the larger validation loss sets the shared parameters; here each client moves lambda as far as the others."""
    name: str = "equal-norm"
    about: str = "each client's change rescaled to the round's median change norm, then the mean (one pull per client)"
    per_tensor: bool = False  # each tensor of lambda on its own (equal-norm-tensor)

    def combine(self, sent: Lambda, lams: list[Lambda], weights: list[float]) -> Lambda:
        return equal_norm_average(sent, lams, weights, self.per_tensor)


BUILTIN: tuple[Aggregator, ...] = (
    Robust("mean", "the paper's: the mean of the clients' lambdas, weighted by --client-weights"),
    Robust("median", "the coordinate-wise median (unweighted; not in the paper)"),
    Robust("trimmed-mean", "the coordinate-wise mean after cutting 20% at each end (unweighted; not in the paper)"),
    EqualNorm(),
    EqualNorm("equal-norm-tensor", "equal-norm for each tensor of lambda on its own (one pull per client and tensor)",
              per_tensor=True))
