"""The one federated round loop: every algorithm is a `RoundStrategy`, this module runs it.

Flower's split, absorbed: the strategy says which clients a round samples and what each receives (`configure`),
and folds their results into the server state (`aggregate`); the engine owns the loop, resume from the round
checkpoint, the executor that runs the clients (in this process or in worker processes) and progress. A strategy
never touches the checkpoint file or the terminal.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol

from ..core.client import Timer
from .loop import Checkpoint, LoopState

Task = tuple
Executor = Callable[[list[Task]], list[Any]]


class RoundStrategy(Protocol):
    label: str

    def initial_state(self) -> LoopState:
        """Round 0's server state (used when there is no checkpoint to resume)."""

    def stop(self, st: LoopState) -> bool:
        """Stop before the next round (early stopping, divergence)."""

    def configure(self, st: LoopState, rnd: int) -> list[Task]:
        """One task per client of round `rnd`: what the executor hands to the client update."""

    def aggregate(self, st: LoopState, rnd: int, tasks: list[Task], results: list[Any], timer: Timer) -> dict | None:
        """Fold the clients' results into `st` (in place) and return the round's history record; None ends the
        run without recording the round (a client diverged: the state keeps what it had)."""

    def progress_info(self, rec: dict, st: LoopState) -> dict:
        """What the progress bar shows after a round."""


def in_process(fn: Callable[..., Any]) -> Executor:
    """Run every task in this process, in order."""
    return lambda tasks: [fn(*t) for t in tasks]


def run_rounds(strategy: RoundStrategy, rounds: int, ckpt: Checkpoint | None, progress, execute: Executor) -> LoopState:
    """Rounds next_round..rounds-1 of `strategy`, a checkpoint after each: a killed run resumes bit-identically
    because every random draw of round t for client c is seeded by (seed, t, c)."""
    st = (ckpt.load() if ckpt else None) or strategy.initial_state()
    progress.start(strategy.label, rounds)
    progress.advance(st.next_round)
    for rnd in range(st.next_round, rounds):
        if strategy.stop(st):
            break
        t0, timer = time.perf_counter(), Timer()
        tasks = strategy.configure(st, rnd)
        with timer.section("clients"):
            results = execute(tasks)
        rec = strategy.aggregate(st, rnd, tasks, results, timer)
        if rec is None:
            if ckpt:
                ckpt.save(st)
            break
        rec["round_s"] = time.perf_counter() - t0
        st.history.append(rec)
        st.next_round = rnd + 1
        if ckpt:
            with timer.section("io"):
                ckpt.save(st)
        rec["io_s"] = timer.t.get("io", 0.0)  # known only after the save: in memory, not in the checkpoint
        progress.advance(1, **strategy.progress_info(rec, st))
    progress.stop()
    return st
