"""What FedL2P's meta-nets read (`meta-train --input-norm NAME`): catalog entries of kind "meta-inputs", registered
like a meta-gradient (`registry.add_meta_inputs`). An entry is fitted once on the seen clients' statistics (its state
is stored with lambda, so personalisation maps an unseen client the same way) and maps one client's statistics
(xi: the BN layers' KL distances, x: the layer inputs' moments) to BNNet's and LRNet's inputs. The maths lives in
core/metanets.py; these entries name it. The built-ins: the paper's raw inputs, and two standardisations (not in the
paper; docs/method/fedl2p.md#the-log-head)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..protocols import MetaInputs

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class Raw:
    """The paper's inputs (Eq. 3, App. E): xi and x as the statistics stage measured them."""
    name: str = "none"
    about: str = "the paper's: raw xi and x"

    def fit(self, xi: Tensor, x: Tensor) -> dict[str, Tensor]:
        return {}

    def apply(self, state: dict[str, Tensor], xi: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
        return xi, x


@dataclass(frozen=True)
class Standardize:
    """Each feature z-scored over the seen clients (x spans orders of magnitude, against weights of ~0.01)."""
    name: str = "standardize"
    about: str = "z-scored over the seen clients (not in the paper)"
    robust: bool = False

    def fit(self, xi: Tensor, x: Tensor) -> dict[str, Tensor]:
        from ..core.metanets import input_normalizer
        return input_normalizer(xi, x, robust=self.robust)

    def apply(self, state: dict[str, Tensor], xi: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
        from ..core.metanets import normalize_inputs
        return normalize_inputs(state, xi, x)


BUILTIN: tuple[MetaInputs, ...] = (Raw(), Standardize(),
                                   Standardize("robust", "z-scored, SD floored at 5% of scale, |z| <= 3", robust=True))
