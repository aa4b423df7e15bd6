"""The batched executor (`--engine batched`): a round's clients run in groups of `--client-batch` N in this process,
each group as one vmapped computation (`core.batched`), through the job's `update_many(context, tasks)`. A job
without one runs its tasks one at a time here (the same results, no gain).

N = auto: on a GPU, N is read from the memory one client's update takes (measured on the round's first client) and
the device's free memory; on the CPU it is 1, since there batching measured slower than one client at a time
(docs/results/bench.md). A group that runs out of device memory is retried at half its size, down to one client, so
a round never fails for it. The group size is where the work ran, not what it computed: artifact ids do not see it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import FedL2PError
from .interface import no_gpu_share

if TYPE_CHECKING:  # torch is imported when a pool opens: the catalog lists this executor without it
    import torch

    from ..runtime import Job, Pool, Runtime

MAX_GROUP = 128
HEADROOM = 0.8  # the share of free device memory `auto` plans to fill


def out_of_memory(e: BaseException) -> bool:
    """A device allocation failure (torch.OutOfMemoryError, or the CPU allocator's message)."""
    import torch
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def auto_size(dev: torch.device, footprint: int, tasks: int) -> int:
    """`--client-batch auto`: as many clients as `HEADROOM` of the free device memory holds at `footprint` bytes each
    (at most MAX_GROUP and the round's clients); 1 on the CPU."""
    import torch
    if dev.type != "cuda" or footprint <= 0:
        return 1
    free, _ = torch.cuda.mem_get_info(dev)
    return max(1, min(MAX_GROUP, tasks, int(HEADROOM * free // footprint)))


class Groups:
    """Runs a list of items through `many(group) -> results` in consecutive groups of `size` (None: `auto`, from
    the first item run alone with its peak device memory read), halving the group on running out of memory. The
    size that fitted is kept for the next call (a stage's later rounds)."""

    def __init__(self, dev: torch.device, size: int | None, most: int = MAX_GROUP):
        self.dev, self.size, self.most = dev, size, most

    def run(self, items: list[Any], many: Callable[[list[Any]], list[Any]],
            one: Callable[[Any], Any] | None = None) -> list[Any]:
        """`many` over the groups; a group of one item through `one` where given (one client at a time is faster than a
        vmapped group of one)."""
        if one is not None:
            many = _single(many, one)
        out: list[Any] = []
        if self.size is None and items:
            out += self._measured(items[0], many)
            items = items[1:]
        i = 0
        while i < len(items):
            group = items[i:i + max(1, self.size or 1)]
            try:
                out += many(group)
            except Exception as e:  # noqa: BLE001 - only an allocation failure is retried; anything else propagates
                if not out_of_memory(e) or len(group) == 1:
                    raise
                self.size = max(1, len(group) // 2)
                _release(self.dev)
                continue
            i += len(group)
        return out

    def _measured(self, item: Any, many: Callable[[list[Any]], list[Any]]) -> list[Any]:
        import torch
        dev = self.dev
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            base = torch.cuda.memory_allocated(dev)
        res = many([item])
        peak = torch.cuda.max_memory_allocated(dev) - base if dev.type == "cuda" else 0
        self.size = auto_size(dev, peak, self.most)
        return res


def _single(many: Callable[[list[Any]], list[Any]], one: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    return lambda group: [one(group[0])] if len(group) == 1 else many(group)


class BatchedPool:
    """`map(tasks)` -> results in task order, groups of `size` tasks through the job's `update_many` (`Groups`:
    halved on running out of memory; `size` None: `auto`). A job without one runs its tasks one at a time."""

    def __init__(self, job: Job, size: int | None):
        from .placement import placed
        self.job = job
        self.local = placed(job.local_context, job.runtime.torch_device)
        self.groups = Groups(self.local.dev, size, min(MAX_GROUP, job.nodes))
        self.update_many: Callable[..., list[Any]] | None = job.update_many

    @property
    def size(self) -> int | None:
        return self.groups.size

    def map(self, tasks: list[Any]) -> list[Any]:
        many = self.update_many
        if many is None:
            return [self.local(self.job.update, t) for t in tasks]
        return self.groups.run(tasks, lambda group: self.local.many(many, group),
                               lambda task: self.local(self.job.update, task))

    def close(self) -> None:
        pass

    def __enter__(self) -> BatchedPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _release(dev: torch.device) -> None:
    import torch
    if dev.type == "cuda":
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class Batched:
    """This process, a round's clients in vmapped groups of --client-batch N."""
    name: str = "batched"
    about: str = "this process, clients in vmapped groups of --client-batch (for a GPU)"

    def check(self, runtime: Runtime) -> None:
        no_gpu_share(runtime)
        # asked for by name, --workers N contradicts it; chosen by --engine auto on a GPU, the workers a pipeline file
        # set for the CPU (the quickstart's 2) are the local engine's and go unused (cli/options.auto_engine_line)
        if runtime.engine == self.name and runtime.workers != 1:
            raise FedL2PError("--engine batched runs in this process: leave --workers at 1")

    def open(self, job: Job) -> Pool:
        size = job.runtime.client_batch
        return BatchedPool(job, None if size == "auto" else int(size))
