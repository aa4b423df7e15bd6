"""Parallel client updates: a round's clients run in N worker processes of one torch thread each.

Each worker builds its read-only context (partition, statistics, model) once, from the store, in its initializer;
a task carries only (client, lambda, round). Every client's randomness comes from its own generator seeded by
(seed, round, client) and results are returned in the order the clients were sampled, so the aggregate is the same
as one process computing them one after another (tested bit for bit). Tasks and results cross process boundaries
through multiprocessing's own channel; nothing is pickled to disk.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any

from .rounds import Failed

if TYPE_CHECKING:
    import torch

    from .placement import OnDevice

_BROKEN = object()  # a task the executor lost when a worker died (not necessarily this task's worker)
_CONTEXT: Any = None
_UPDATE: Callable | None = None


def _init(build: Callable[..., Any], args: tuple, update: Callable, dev: str) -> None:
    global _CONTEXT, _UPDATE
    import torch

    from .placement import placed
    torch.set_num_threads(1)
    _CONTEXT, _UPDATE = placed(build(*args), torch.device(dev)), update


def on_runtime(runtime: dict, build: Callable[..., Any], *args: Any) -> OnDevice:
    """`build(*args, runtime)` after applying the parent's runtime (received whole, as a dict), placed on the
    runtime's device: how a worker process or ClientApp makes the same choices (device, determinism, one torch
    thread)."""
    from .. import plugins
    from ..runtime import Runtime
    from .placement import OnDevice
    rt = Runtime.from_dict(runtime).resolved().apply(threads=1)
    rt = rt.replace(catalog=plugins.as_worker(rt.allow_import, rt.plugins))  # this process's own, with its runtime
    return OnDevice(build(*args, rt), rt.torch_device)


def _run(task: Any) -> Any:
    return _CONTEXT(_UPDATE, task)


def _ready() -> int:
    """A no-op that holds its worker briefly, so that a batch of them spreads over every worker."""
    time.sleep(0.05)
    return os.getpid()


class ClientPool:
    """`map(tasks)` -> results in task order. With workers == 1 it runs in this process on `local_context`, placed
    on `dev` (an error there is a bug and propagates); worker processes place their own (`on_runtime`). With worker
    processes, a client whose worker dies (killed, out of memory), raises, or does not answer within `timeout`
    seconds comes back as `Failed(reason)`, and the round's policy decides (engine.rounds.RoundPolicy); the pool is
    then started afresh, since a dead or hung worker cannot be reused. (A multiprocessing.Pool would lose a dead
    worker's task and wait for it forever.)"""

    def __init__(self, workers: int, build: Callable[..., Any], args: tuple, update: Callable, local_context: Any,
                 dev: torch.device, timeout: float | None = None):
        from .placement import placed
        self.update, self.timeout = update, timeout
        self.local = placed(local_context, dev) if workers == 1 else None
        self.workers = workers
        self._executor: Callable[[], ProcessPoolExecutor] = lambda: ProcessPoolExecutor(
            workers, mp_context=mp.get_context("spawn"), initializer=_init, initargs=(build, args, update, str(dev)))
        self.pool = self._start() if workers > 1 else None

    def _start(self) -> ProcessPoolExecutor:
        """A pool whose workers have all started and built their context, so that a round's timeout counts the
        clients' updates and not the workers' start-up (importing torch, reading the store: seconds)."""
        pool, t0 = self._executor(), time.monotonic()
        seen: set[int] = set()
        try:
            while len(seen) < self.workers and time.monotonic() - t0 < 600:
                seen |= {f.result() for f in [pool.submit(_ready) for _ in range(self.workers)]}
        except BrokenProcessPool:  # a worker that cannot start: a lazy pool, whose first round's clients fail and say so
            pool = self._executor()
        return pool

    def map(self, tasks: list[Any]) -> list[Any]:
        if self.pool is None:
            return [self.local(self.update, t) for t in tasks]  # type: ignore[misc]  # one worker: local is set
        out = self._batch(tasks)
        # a dying worker breaks the whole executor: every unfinished client re-runs alone in a fresh pool, so the one
        # whose update kills its worker fails by itself and the others still answer
        for i in [i for i, r in enumerate(out) if r is _BROKEN]:
            out[i] = self._batch([tasks[i]])[0]
            if out[i] is _BROKEN:
                out[i] = Failed("its worker process died (killed or out of memory)")
        return out

    def _batch(self, tasks: list[Any]) -> list[Any]:
        """Results in task order; `_BROKEN` where the executor broke first, `Failed` for an error or no reply in
        time. A broken or hung pool is replaced before returning."""
        futures = [self.pool.submit(_run, t) for t in tasks]  # type: ignore[union-attr]  # map calls this with a pool
        _, late = wait(futures, timeout=self.timeout)
        out: list[Any] = []
        for f in futures:
            if f in late:
                out.append(Failed(f"no reply within {self.timeout:g} s"))
                continue
            try:
                out.append(f.result())
            except BrokenProcessPool:
                out.append(_BROKEN)
            except Exception as e:  # noqa: BLE001 - the client failed; the round's policy decides what follows
                out.append(Failed(f"{e.__class__.__name__}: {e}"))
        if late or any(r is _BROKEN for r in out):
            self.close()
            self.pool = self._start()
        return out

    def close(self) -> None:
        if self.pool is not None:
            for p in list(getattr(self.pool, "_processes", {}).values()):  # do not wait for a round in flight
                p.terminate()
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

    def __enter__(self) -> ClientPool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
