"""Parallel client updates: a round's clients run in N worker processes of one torch thread each.

Each worker builds its read-only context (partition, statistics, model) once, from the store, in its initializer;
a task carries only (client, lambda, round). Every client's randomness comes from its own generator seeded by
(seed, round, client) and results are returned in the order the clients were sampled, so the aggregate is the same
as one process computing them one after another (tested bit for bit). Tasks and results cross process boundaries
through multiprocessing's own channel; nothing is pickled to disk.
"""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

from ..errors import FedL2PError

_CONTEXT: Any = None
_UPDATE: Callable | None = None


def _init(build: Callable[..., Any], args: tuple, update: Callable) -> None:
    global _CONTEXT, _UPDATE
    import torch
    torch.set_num_threads(1)
    _CONTEXT, _UPDATE = build(*args), update


def on_device(spec: tuple[str, bool], build: Callable[..., Any], *args: Any) -> Any:
    """`build(*args)` after choosing the parent's device: how a worker process or ClientApp makes the same choice."""
    from .. import device
    device.use(*spec)
    return build(*args)


def _run(task: tuple) -> Any:
    return _UPDATE(_CONTEXT, *task)


class ClientPool:
    """`map(tasks)` -> results in task order. With workers == 1 it runs in this process on `local_context`.
    A worker process that dies (killed, out of memory) stops the run with one line instead of hanging: a
    multiprocessing.Pool loses the dead worker's task and waits for it forever; an executor reports it."""

    def __init__(self, workers: int, build: Callable[..., Any], args: tuple, update: Callable, local_context: Any):
        self.update, self.local = update, local_context
        self.pool = None
        if workers > 1:
            self.pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init,
                                            initargs=(build, args, update))

    def map(self, tasks: list[tuple]) -> list[Any]:
        if self.pool is None:
            return [self.update(self.local, *t) for t in tasks]
        try:
            return list(self.pool.map(_run, tasks))
        except BrokenProcessPool:
            raise FedL2PError("a worker process died during a round (killed or out of memory); run the same command "
                              "again to resume from the last round's checkpoint") from None

    def close(self) -> None:
        if self.pool is not None:
            for p in list(getattr(self.pool, "_processes", {}).values()):  # do not wait for a round in flight
                p.terminate()
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

    def __enter__(self) -> "ClientPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_pool(engine: str, workers: int, build: Callable[..., Any], args: tuple, update: Callable, local_context: Any,
              nodes: int, gpus_per_client: float = 0.0):
    """The executor of a round's client updates: `local` (this process, or `workers` processes) or `flower`
    (Flower's simulation runtime with `nodes` virtual SuperNodes, `workers` ClientApps at a time, each given
    `gpus_per_client` of a GPU). Every process computes on this process's device (`fedl2p --device`)."""
    from .. import device
    spec = device.spec()
    if engine == "flower" and gpus_per_client > 0:  # Ray hands each ClientApp its GPU share as CUDA_VISIBLE_DEVICES
        spec = ("cuda", spec[1])
    args = (spec, build, *args)
    if engine == "flower":
        from .flower import FlowerPool
        return FlowerPool(workers, on_device, args, update, nodes, gpus_per_client)
    return ClientPool(workers, on_device, args, update, local_context)
