"""What each stage's reader returns, named once: a stage is read by its `StageKey`, its name typed by what its row's
reader gives (`inputs.get(STATS).value` is a `StatsTable`), so the type checker rejects a wrong attribute on a read.
The value types live here, below the stage modules, so that a stage reading another names its type without importing
it (tests/test_layout.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, NamedTuple, TypeVar

from ..algorithms.meta_loop import initial_lambda

if TYPE_CHECKING:
    import torch

    from ..algorithms.systems.base import Trained
    from ..configs import MetaTrainConfig
    from ..core.metanets import Lambda
    from ..io.partition_h5 import Partition
    from ..io.results_h5 import Results
    from ..io.stats_h5 import StatsTable
    from ..protocols import MetaHead, MetaInputs

T = TypeVar("T")


class StageKey(str, Generic[T]):
    """A stage's name (it is that string: store folders, parents and plans use it as before), typed by `T`, what the
    stage's row's reader returns."""
    __slots__ = ()


class Pretrained(NamedTuple):
    """What a pretrain artifact holds, as a later stage reads it: a model built for it, holding its weights, and its
    state dict."""
    model: torch.nn.Module
    state: dict


@dataclass(frozen=True)
class MetaTrained:
    """What a meta-train artifact holds, as a later stage reads it."""
    lam: Lambda
    norm: dict | None  # its --input-norm entry's state, fitted on its seen clients (None: the entry keeps none)
    cfg: MetaTrainConfig  # its run's settings
    head: MetaHead  # its --head entry
    input_entry: MetaInputs  # its --input-norm entry

    def inputs(self, xi: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A client's meta-net inputs from its statistics, as its run mapped them."""
        return self.input_entry.apply(self.norm or {}, xi, x)

    def widths(self, table: StatsTable) -> tuple[int, int]:
        """BNNet's and LRNet's input widths for `table`'s statistics."""
        return input_widths(self.input_entry, self.norm, table)

    def initial(self, n_bn: int, n_x: int, n_params: int) -> Lambda:
        """Its run's lambda at round 0 (re-drawn from its seed): the control a learned split is read beside."""
        return initial_lambda(self.cfg, self.head, n_bn, n_x, n_params)


def input_widths(entry: MetaInputs, norm: dict | None, table: StatsTable) -> tuple[int, int]:
    """BNNet's and LRNet's input widths under the --input-norm entry (LRNet's may differ from the statistics')."""
    zi, zx = entry.apply(norm or {}, table.xi[0], table.x[0])
    return zi.shape[0], zx.shape[0]


@dataclass(frozen=True)
class Personalized:
    """What a personalize artifact holds, as a later stage reads it."""
    results: Results
    learned: list[str]  # the rows a meta-train artifact made (learned variants), in the results' order


PARTITION: StageKey[Partition] = StageKey("partition")
PRETRAIN: StageKey[Pretrained] = StageKey("pretrain")
STATS: StageKey[StatsTable] = StageKey("stats")
META_TRAIN: StageKey[MetaTrained] = StageKey("meta-train")
PFL: StageKey[Trained] = StageKey("pfl")
PERSONALIZE: StageKey[Personalized] = StageKey("personalize")
