"""The server steps a FedL2P federation can take (`meta-train --meta-opt NAME`): catalog entries of kind
"server-step", registered like a meta-gradient (`registry.add_server_step`). After the round's replies are combined
(`--aggregate`, `--client-weights`), the step turns that combination into the next lambda. The built-ins: the paper's
FedAvg (the combination is the next lambda) and FedAdam (Reddi et al. 2021)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..protocols import ServerStep

if TYPE_CHECKING:
    from torch import Tensor

    from ..core.metanets import Lambda


@dataclass(frozen=True)
class FedAvg:
    """The paper's server: the round's combined lambda is the next one (no state)."""
    name: str = "fedavg"
    about: str = "the paper's: the clients' combined lambda"

    def step(self, lam: Lambda, combined: Lambda, state: dict[str, Tensor], t: int,
             lr: float) -> tuple[Lambda, dict[str, Tensor]]:
        return combined, state


@dataclass(frozen=True)
class FedAdam:
    """Adam on the pseudo-gradient lambda - combined, step size `--server-lr` (core.metanets.ServerAdam); its moments
    are the state (not in the FedL2P paper)."""
    name: str = "fedadam"
    about: str = "Adam on the mean client change (Reddi et al. 2021)"

    def step(self, lam: Lambda, combined: Lambda, state: dict[str, Tensor], t: int,
             lr: float) -> tuple[Lambda, dict[str, Tensor]]:
        from ..core.metanets import ServerAdam
        return ServerAdam(lr).step(lam, combined, state, t)


BUILTIN: tuple[ServerStep, ...] = (FedAvg(), FedAdam())
