"""What a personalised-FL system is to fedl2p: the class `fedl2p pfl-train --algo NAME` trains and `fedl2p personalize
--methods NAME` evaluates. fedl2p's own systems (pFedLA, HeurpFedLA, CAFeMe) and a plugin's are the same kind of
class, found through the same catalog entry (`System(name, label, trainer="package.module:Class")`) and run through
the same executors, so `--workers N` and `--engine flower` apply to every one of them.

This module imports no torch: `fedl2p --help` and a plugin's registration stay light.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from torch import nn

    from ...artifacts import Artifact, Draft
    from ...catalog import Catalog
    from ...configs import PFLConfig
    from ...core.client import ClientData
    from ...engine.loop import LoopState
    from ...engine.placement import OnDevice
    from ...engine.rounds import RoundStrategy
    from ...io.partition_h5 import Partition


class PFLSystem:
    """A personalised-FL system. fedl2p makes one instance (no arguments) in each process that uses it, and sets its
    `catalog`: the pieces of the run that made it, where its models are looked up (`api.build_model(...,
    catalog=self.catalog)`).

    How `pfl-train` runs it, in order:
    1. `context(cfg, part)` in this process and in every worker process or Flower ClientApp: what a client's update
       reads. The executor places it on the runtime's device.
    2. `strategy(cfg, part, local)`: the server side, a `RoundStrategy` (initial_state, configure -> one task per
       client, aggregate). `local(fn, arg)` runs `fn(context, arg)` on the device in this process (a validation).
    3. Each round, `client(context, task)` per task, wherever the executor runs it (`client_many(context, tasks)` for
       a group, where the system has one and the executor batches); `aggregate` gets the results.
       Tasks and results cross processes and Flower messages: tensors, dicts with string keys, lists, tuples,
       numbers, strings, None and dataclasses of this plugin's package.
    4. `save(strategy, state, draft)` writes the trained weights into the artifact and returns its metrics.
    `personalize` then calls `load` once and `accuracy` per client and seed.

    SETTINGS: {algo name: (PFLConfig field, ...)}, the options its artifact id includes besides the shared ones
    (algo, model, rounds, fraction, batch_size, lr, eval_every, seed). One class may serve several names.
    Options: the system's own options, a dataclass whose fields have defaults (bool, int, float or str), set with
    `pfl-train --options name=value,...` or a `[[pfl]]` table's `options = {name = value}`; `self.options(cfg)` is
    the instance. All of its fields enter the artifact's id. None (the default): the system takes no options.
    """

    SETTINGS: ClassVar[dict[str, tuple[str, ...]]] = {}
    Options: ClassVar[type | None] = None
    catalog: Catalog  # set by fedl2p once it has made the instance (stages/pfl.py `system`)

    def options(self, cfg: PFLConfig) -> Any:
        """`cfg.options` as this system's `Options` (checked: a name it lacks or a value of the wrong type is one
        line naming --options)."""
        from .options import parse
        return parse(self.Options, cfg.options, cfg.algo)

    def context(self, cfg: PFLConfig, part: Partition) -> Any:
        """What a client's update reads (model, partition, settings), built once per process; no round state."""
        raise NotImplementedError

    def strategy(self, cfg: PFLConfig, part: Partition, local: OnDevice) -> RoundStrategy[Any]:
        """The rounds' server side; `local` is this process's placed context."""
        raise NotImplementedError

    @staticmethod
    def client(ctx: Any, task: Any) -> Any:
        """One client's update, its tensors on ctx's device. A static method: worker processes import it by name."""
        raise NotImplementedError

    # `client_many(ctx, tasks) -> results`: several clients' updates as one computation (`--engine batched`), per
    # client what `client` computes to float rounding; None: the batched executor runs `client` one at a time
    client_many: ClassVar[Any] = None  # a staticmethod, or None (a ClassVar Callable would read as a bound method)

    def save(self, strategy: Any, state: LoopState, draft: Draft) -> dict:
        """The trained state into `draft` (`draft.path(FILE)`, `api.save_weights`); returns the artifact's metrics."""
        raise NotImplementedError

    def load(self, art: Artifact, cfg: PFLConfig, model: Any) -> Any:
        """The trained state `save` wrote (`art.file(FILE)`), for `accuracy`."""
        raise NotImplementedError

    def accuracy(self, trained: Any, client: int, data: ClientData, seed: int, steps: int) -> float:
        """Client `client`'s test accuracy (NaN where the system has no model for it). A system that adapts to a
        client draws its batches from `batch_stream(seed, client)`, the stream every method shares."""
        raise NotImplementedError


@dataclass
class Trained:
    """A loaded pfl artifact, ready to evaluate clients: its model and the system's own trained state."""

    algo: str
    art_id: str
    model: nn.Module
    cfg: PFLConfig
    num_classes: int
    state: Any
