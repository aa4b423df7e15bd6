"""The one federated round loop: every algorithm is a `RoundStrategy`, this module runs it.

Flower's split, absorbed: the strategy says which clients a round samples and what each receives (`configure`),
and folds their results into the server state (`aggregate`); the engine owns the loop, resume from the round
checkpoint, the executor that runs the clients (in this process or in worker processes) and progress. A strategy
never touches the checkpoint file or the terminal.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..core.client import Timer
from ..core.settings import RoundPolicy
from ..errors import FedL2PError
from .loop import Checkpoint, LoopState

if TYPE_CHECKING:
    from .placement import OnDevice

class Task(Protocol):
    """What a round's client receives: each strategy's own dataclass (MetaTask, LocalTask, ...), naming its client."""
    client: int


RunTasks = Callable[[list[Task]], list[Any]]  # a round's tasks -> their replies, in order (`in_process`, a Pool's run)
TaskT = TypeVar("TaskT", bound=Task)  # a strategy's own task type: it configures and aggregates the same one


class RoundObserver(Protocol):
    """What watches the round loop, with one signature: the progress bar (a stage's `Progress`, through
    `ProgressObserver`), an experiment tracker (tracking.py, carried by a `Watch`) and a deployment's server log
    (flower/app.py). None of them touches the state or the checkpoint."""

    def start(self, label: str, rounds: int, done: int) -> None:
        """Before the loop: `done` of `rounds` rounds came from the checkpoint."""

    def round(self, label: str, rec: dict, st: LoopState, shown: dict) -> None:
        """After each recorded round and its checkpoint: the round's record (as history.csv will hold it), the state,
        and what a progress line shows of it."""

    def stop(self) -> None:
        """After the last round."""


@dataclass
class ProgressObserver:
    """A stage's progress bar (`start(description, total)`, `advance(n, **info)`, `stop()`) as a round observer."""
    progress: Any

    def start(self, label: str, rounds: int, done: int) -> None:
        self.progress.start(label, rounds)
        self.progress.advance(done)

    def round(self, label: str, rec: dict, st: LoopState, shown: dict) -> None:
        self.progress.advance(1, **shown)

    def stop(self) -> None:
        self.progress.stop()


@dataclass(frozen=True)
class Watch:
    """A stage's progress bar with the observers its build opened (an experiment tracker: `Draft.observers`): what a
    stage hands to `run_rounds` as its `watch`, and to a pFL system's `train` as its progress (start/advance/stop
    pass through to the bar)."""
    progress: Any
    observers: tuple[RoundObserver, ...] = ()

    def start(self, description: str, total: int) -> None:
        self.progress.start(description, total)

    def advance(self, n: int = 1, **info: Any) -> None:
        self.progress.advance(n, **info)

    def stop(self) -> None:
        self.progress.stop()


def observers_of(watch: Any) -> tuple[RoundObserver, ...]:
    """The one list a run reports to: its caller's `watch` (a RoundObserver, or a stage's Progress) and the observers
    a `Watch` carries."""
    first = watch if hasattr(watch, "round") else ProgressObserver(watch)
    return (first, *getattr(watch, "observers", ()))


@dataclass(frozen=True)
class Failed:
    """An executor's marker in place of a client's result: the client did not answer, and why."""
    reason: str


class RoundStrategy(Protocol[TaskT]):
    label: str

    def initial_state(self) -> LoopState:
        """Round 0's server state (used when there is no checkpoint to resume)."""

    def stop(self, st: LoopState) -> bool:
        """Stop before the next round (early stopping, divergence)."""

    def configure(self, st: LoopState, rnd: int, attempt: int = 0) -> list[TaskT]:
        """One task per client of round `rnd`: what the executor hands to the client update. `attempt` > 0: the
        round is retried after too few clients answered, with a fresh sample of clients."""

    def aggregate(self, st: LoopState, rnd: int, tasks: list[TaskT], results: list[Any], timer: Timer) -> dict | None:
        """Fold the clients' results into `st` (in place) and return the round's history record; None ends the
        run without recording the round (a client diverged: the state keeps what it had)."""

    def progress_info(self, rec: dict, st: LoopState) -> dict:
        """What the progress bar shows after a round."""


def in_process(fn: Callable[..., Any], placed: OnDevice | None = None) -> RunTasks:
    """Run every task in this process, in order: `fn(task)`, or with `placed` (an `engine.placement.OnDevice`)
    `fn(context, task)` with the task on the context's device and the result back on the host."""
    if placed is None:
        return lambda tasks: [fn(t) for t in tasks]
    return lambda tasks: [placed(fn, t) for t in tasks]


def client_name(strategy: RoundStrategy[Any], c: int, bare: bool = False) -> str:
    """How logs and history name client `c`: a strategy's `names` (a deployment's site names), else its id."""
    name = getattr(strategy, "names", {}).get(c)
    return name if name is not None else str(c) if bare else f"client {c}"


def answered(strategy: RoundStrategy[Any], st: LoopState, rnd: int, execute: RunTasks, policy: RoundPolicy
             ) -> tuple[list[Task], list[Any], list[str], list[Task]]:
    """Round `rnd`'s tasks and results of the clients that answered, a line per client that did not (this
    attempt's and every earlier attempt's), and every task of the attempt that counted. Too few answers: the round
    is sampled again, `policy.retries` times."""
    failures: list[str] = []
    for attempt in range(policy.retries + 1):
        tasks = strategy.configure(st, rnd, attempt) if attempt else strategy.configure(st, rnd)
        results = execute(tasks)
        ok = [(t, r) for t, r in zip(tasks, results) if not isinstance(r, Failed)]
        failures += [f"{client_name(strategy, t.client)}: {r.reason}" + (f" (attempt {attempt + 1})" if attempt else "")
                     for t, r in zip(tasks, results) if isinstance(r, Failed)]
        if len(ok) >= policy.needed(len(tasks)):
            return [t for t, _ in ok], [r for _, r in ok], failures, tasks
    raise FedL2PError(f"round {rnd + 1}: too few clients answered (at least {policy.needed(len(tasks))} of "
                      f"{len(tasks)} needed, --min-answers {policy.min_answers:g}) in {policy.retries + 1} attempt(s): "
                      + "; ".join(failures))


def run_rounds(strategy: RoundStrategy[Any], rounds: int, ckpt: Checkpoint | None, watch: Any, execute: RunTasks,
               policy: RoundPolicy = RoundPolicy()) -> LoopState:
    """Rounds next_round..rounds-1 of `strategy`, a checkpoint after each: a killed run resumes bit-identically
    because every random draw of round t for client c is seeded by (seed, t, c). Clients that fail are handled by
    `policy`; those that did not answer are named in the round's record (`failed`). `watch` (a stage's Progress, a
    RoundObserver, or a `Watch`: a progress with the observers a build opened) sees the start, every finished round
    after its checkpoint, and the end."""
    st = (ckpt.load() if ckpt else None) or strategy.initial_state()
    observers = observers_of(watch)
    for o in observers:
        o.start(strategy.label, rounds, st.next_round)
    for rnd in range(st.next_round, rounds):
        if strategy.stop(st):
            break
        t0, timer = time.perf_counter(), Timer()
        with timer.section("clients"):
            tasks, results, failures, sampled = answered(strategy, st, rnd, execute, policy)
        rec = strategy.aggregate(st, rnd, tasks, results, timer)
        if rec is None:
            if ckpt:
                ckpt.save(st)
            break
        rec["round_s"] = time.perf_counter() - t0
        if failures:
            rec["failed"] = "; ".join(failures)
            if "sampled" in rec:  # the strategy saw only the clients that answered: name every one sampled
                rec["sampled"] = " ".join(client_name(strategy, t.client, bare=True) for t in sampled)
        st.history.append(rec)
        st.next_round = rnd + 1
        if ckpt:
            with timer.section("io"):
                ckpt.save(st)
        rec["io_s"] = timer.t.get("io", 0.0)  # known only after the save: in memory, not in the checkpoint
        shown = strategy.progress_info(rec, st) | ({"failed": len(failures)} if failures else {})
        for o in observers:
            o.round(strategy.label, rec, st, shown)
    for o in observers:
        o.stop()
    return st
