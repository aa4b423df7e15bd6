"""The executor interface (`--engine NAME`): what a pool runs (`Job`), the pool it opens (`Pool`) and the executor the
catalog holds (`Executor`). Its own module, below engine/executors.py and the executors it lists, so an executor's
module imports the interface and nothing that imports it back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import FedL2PError

if TYPE_CHECKING:
    from ..runtime import Runtime


@dataclass(frozen=True)
class Job:
    """What a pool runs: `update(context, task)` for each task, on a context each process builds once as
    `build(*args, runtime)` (worker processes, ClientApps; `sent` is the runtime they receive, with the parent's
    plugins and allow-list) or that this process already holds (`local_context`); `nodes` clients in all.
    `update_many(context, tasks)`, where the stage has one, computes a group of tasks at once (the batched
    executor's path; per task the same results as `update`)."""
    runtime: Runtime
    sent: Runtime
    build: Callable[..., Any]
    args: tuple
    update: Callable[..., Any]
    local_context: Any
    nodes: int
    update_many: Callable[..., list[Any]] | None = None


class Pool(Protocol):
    """One stage run's client pool."""

    def map(self, tasks: list[Any]) -> list[Any]:
        """The tasks' results in task order (`rounds.Failed` for a client that failed)."""
        ...

    def close(self) -> None: ...
    def __enter__(self) -> Pool: ...
    def __exit__(self, *exc: Any) -> None: ...


class Executor(Protocol):
    """An executor as the catalog holds it: its `--engine` name, one line about it, a check of the runtime options it
    reads and the pool it opens."""

    @property
    def name(self) -> str: ...

    @property
    def about(self) -> str: ...

    def check(self, runtime: Runtime) -> None:
        """Refuse (FedL2PError, one line naming the option) runtime options this executor cannot honour."""
        ...

    def open(self, job: Job) -> Pool: ...


def no_gpu_share(runtime: Runtime) -> None:
    """What every executor but Flower's refuses: a GPU share per client (`--gpus-per-client`)."""
    if runtime.gpus_per_client > 0:
        raise FedL2PError("--gpus-per-client is for --engine flower with a CUDA --device")
