"""What a method is handed in `personalize`, typed: the personalisation being prepared (`Setup`), one of its rows
(`Row`), and one client and seed on the personalisation harness (`ClientContext`, with its fine-tunings, `Trial`).
Protocols: stages/personalize.py and stages/harness.py implement them; a method depends on these, not on the stages."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch import nn

    from ..configs import PersonalizeConfig
    from ..core.client import ClientData
    from ..core.finetune import Strategy
    from .registry import HandMade, Method


class Row(Protocol):
    """One row of a personalisation: its name in the results, its method, what the method prepared for it (a learned
    variant's meta-nets, a system's trained models)."""
    name: str
    method: Method
    payload: Any


class Setup(Protocol):
    """The personalisation being prepared: its config and the artifacts it reads. A method asks it for rows
    (`row`, `meta_row`, `pfl_row`) and the artifacts they come from (`newest_learned`, `newest_meta`, `newest_pfl`)."""
    cfg: PersonalizeConfig
    model: nn.Module | None       # the harness's model, once built (a hand-made method's `tensors` reads it)

    @property
    def n_bn(self) -> int: ...
    @property
    def n_params(self) -> int: ...
    def row(self, name: str, method: Method, art: Any = None, payload: Any = None) -> Row: ...
    def newest_learned(self, family: str) -> Any: ...
    def newest_meta(self, variant: str) -> Any: ...
    def meta_row(self, method: Any, art: Any) -> Row: ...
    def learned_strategy(self, row: Row, c: int) -> Strategy | None: ...
    def newest_pfl(self, algo: str) -> Any: ...
    def pfl_row(self, method: Any, art: Any) -> Row: ...


class Trial(Protocol):
    """One fine-tuning of a client under a strategy and seed; its scores are computed when asked."""

    def evaluate(self, split: str, stats: str = "running") -> tuple[float, float]:
        """(loss, accuracy) on the client's `split` (val, test) under `stats` (running, test-batch)."""
        ...


class Client(Protocol):
    """A client on the harness's device: its id and its data (train, val, test splits)."""
    id: int
    data: ClientData


class ClientContext(Protocol):
    """One client and seed of a personalisation, what `Method.personalize` gets: every fine-tuning it asks for draws
    the client's batch stream for the seed, so every method's row of a client and seed sees the same batches."""
    setup: Setup
    client: Client
    seed: int
    strategies: dict[str, Strategy | None]  # each row's strategy for this client, by row name

    def handmade(self, method: HandMade, factor: float) -> Trial:
        """Fine-tuning under a hand-made method's strategy at `factor` x its LR (computed once, shared)."""
        ...

    def handmade_strategy(self, method: HandMade, factor: float) -> Strategy:
        """The Strategy `handmade(method, factor)` fine-tunes under (for `Method.wants`)."""
        ...

    def unadapted(self, split: str) -> tuple[float, float]:
        """(loss, accuracy) of the pretrained parameters on `split`, without fine-tuning."""
        ...

    def learned(self, row: Row) -> Trial | None:
        """Fine-tuning under the strategy a learned row recorded for this client (None: it has none)."""
        ...

    def finetune(self, strategy: Strategy) -> Trial:
        """Fine-tuning under any strategy (a learned one changed, say), on the client's batches for the seed."""
        ...

    def system(self, row: Row) -> float:
        """A pFL system's test accuracy on this client (NaN where it has no model for it)."""
        ...
