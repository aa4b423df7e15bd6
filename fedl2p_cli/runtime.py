"""Where and how work runs, as one value: the `Runtime`. Never what it computes, so no field of it enters an
artifact's id.

The command line builds it once per command (`fedl2p --device/--deterministic/--threads/--lock-timeout/--track`, a
pipeline file's `device`, and the command's own runtime options: `--workers`, `--engine`, `--gpus-per-client` and the failure policy) and
passes it to the stage, which hands it to its executor. A worker process or a Flower ClientApp receives it whole as
a plain dict (`to_dict`; no pickle; all but its catalog of pieces, which it builds anew from `plugins`) and
applies it (`apply`) before building anything. `core/` never sees it: its
functions follow their inputs' device. The artifact's manifest records it (`describe`: `computed_on`).

Beside it, the executor interface (`--engine NAME`): what a pool runs (`Job`), the pool it opens (`Pool`) and the
executor the catalog holds (`Executor`, its kind key `EXECUTOR`). They name the Runtime, which carries the catalog, so
they are declared here rather than with the other plugin-facing Protocols (protocols.py, below the catalog).

Torch-free at import, so `fedl2p --help` stays fast; the torch parts are imported where they are used.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .catalog import Catalog, Kind  # at run time: the CLI reads the Runtime's field types (get_type_hints)
from .core.config import AT_LEAST_1, FRACTION, INTERNAL, NON_NEGATIVE, UNIT, opt
from .core.settings import RoundPolicy

ROUNDS = "rounds"  # `scope` of the options that the commands running federated rounds (pretrain, meta-train) take



@dataclass(frozen=True, kw_only=True)
class Runtime:
    device: str = opt("cpu", "Where tensors live: a resolved torch device name (cpu, cuda:0).", cli=False)
    deterministic: bool = opt(False, "cuDNN's deterministic kernels and torch.use_deterministic_algorithms.", cli=False)
    threads: int = opt(1, "Torch CPU threads of this process (worker processes and ClientApps: one each).", AT_LEAST_1,
                       cli=False)
    workers: int | Literal["auto"] = opt(1, "Processes running a round's clients at once (--engine local), one torch "
                                            "thread each; auto: one per free core (cores less the load average). "
                                            "Same artifact.", AT_LEAST_1, scope=ROUNDS)
    engine: str = opt("auto", "Where client updates run: auto (batched on a GPU, else local) | local (--workers "
                                 "processes) | flower (pip install 'fedl2p[flower]') | batched | a plugin's."
                                 "<plugin-executors>",
                      scope=ROUNDS)
    client_batch: int | Literal["auto"] = opt("auto", "Clients computed as one vmapped group (--engine batched; "
                                                      "personalize); auto: from a client's GPU memory, 1 on the CPU "
                                                      "(give a number to group there).",
                                              AT_LEAST_1,
                                              scope=ROUNDS)
    gpus_per_client: float = opt(0.0, "With --engine flower on a GPU: the share of a GPU each ClientApp gets (0.25: "
                                      "four per GPU). Not part of the artifact's id.", UNIT,
                                 scope=ROUNDS)
    # the failure policy: what a round does when clients fail (RoundPolicy)
    round_timeout: float = opt(0.0, "Seconds a round waits for its clients' replies (0: no limit); a client without "
                                    "one is named in history.csv's `failed` column.", NON_NEGATIVE, scope=ROUNDS)
    min_answers: float = opt(1.0, "Share of a round's sampled clients that must answer (1: all); with fewer the round "
                                  "is re-sampled, up to --round-retries times.", FRACTION, scope=ROUNDS)
    round_retries: int = opt(0, "Fresh samples of a round whose clients answered too few (see --min-answers).",
                             NON_NEGATIVE, scope=ROUNDS)
    plugins: tuple[str, ...] = opt((), "The plugin modules a worker process or Flower site loads before it builds "
                                   "anything.", cli=False)
    allow_import: tuple[str, ...] = opt((), "The modules a worker process may import besides its plugins' (the "
                                        "parent's --allow-import list).", cli=False)
    # how a build meets the store and what it reports (`fedl2p --lock-timeout --track --track-uri`; report's mode)
    lock_timeout: float | None = opt(None, "Seconds to wait while another process builds the same artifact (None: as "
                                           "long as it takes; 0: refuse at once).", cli=False)
    track: str | None = opt(None, "The experiment tracker every build logs to: tensorboard or mlflow (None: none).",
                            cli=False)
    track_uri: str | None = opt(None, "Where `track` logs: a folder or an MLflow server URI (None: the tracker's own "
                                      "folder, ./runs or ./mlruns).", cli=False)
    reuse_only: bool = opt(False, "Build nothing: each stage returns the artifact its inputs name, or refuses (how "
                                  "`fedl2p report` finds a pipeline's artifacts).", cli=False)
    # the pieces this run looks up (None: none handed over, which `plugins.of` refuses). It stays in this process: a
    # worker process or ClientApp builds its own from `plugins` and `allow_import`.
    catalog: Catalog | None = dataclasses.field(default=None, compare=False, repr=False, metadata={
        "help": "The catalog of pieces this run looks up (plugins.of(runtime)).", "cli": False, INTERNAL: True})

    def __post_init__(self) -> None:
        if self.workers == "auto":  # resolved once, here: a worker process or ClientApp receives the number
            object.__setattr__(self, "workers", free_cores())

    @classmethod
    def create(cls, device: str = "auto", **fields: Any) -> Runtime:
        """A runtime on the device `device` names (auto: the first CUDA GPU when one is present, else the CPU);
        a device that does not exist here is refused with one line."""
        return cls(device=device, **fields).resolved()

    def resolved(self) -> Runtime:
        """This runtime on the device its `device` names here (auto: the first CUDA GPU when one is present, else the
        CPU): the one place a device is decided, by the command line, a worker process and a Flower site alike."""
        from .device import resolve
        return self.replace(device=str(resolve(self.device)))

    @property
    def torch_device(self):
        import torch
        return torch.device(self.device)

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def executor(self) -> str:
        """The executor `engine` names; auto: `batched` on a GPU (clients as vmapped groups: 10x cheaper per client
        there, docs/guide/gpu.md), `local` on the CPU (where one client at a time measures fastest)."""
        if self.engine != "auto":
            return self.engine
        return "batched" if self.on_gpu else "local"

    def policy(self) -> RoundPolicy:
        return RoundPolicy(self.round_timeout or None, self.min_answers, self.round_retries)

    def timeout(self) -> float | None:
        return self.round_timeout or None

    def replace(self, **changes: Any) -> Runtime:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """What a worker process, a ClientApp or a deployment's run config receives: JSON-safe values only."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in dataclasses.fields(self)
                if not f.metadata.get(INTERNAL)}

    @classmethod
    def from_dict(cls, d: dict) -> Runtime:
        """The inverse of `to_dict`; keys it does not know are ignored (a run config written by another version)."""
        known = {f.name for f in dataclasses.fields(cls) if not f.metadata.get(INTERNAL)}
        kw = {k: v for k, v in d.items() if k in known}
        for key in ("plugins", "allow_import"):
            if key in kw:
                kw[key] = tuple(kw[key])
        return cls(**kw)

    def apply(self, threads: int | None = None) -> Runtime:
        """Make this process compute as the runtime says: torch's threads, determinism, the current CUDA device.
        Called once per process: by the command line, and by each worker process or ClientApp (`threads=1`)."""
        import torch
        torch.set_num_threads(threads or self.threads)
        if self.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's reproducible workspace
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
            torch.use_deterministic_algorithms(True)
        if self.on_gpu:
            torch.cuda.set_device(self.torch_device)
        return self

    def describe(self) -> dict:
        """For the manifest (`computed_on`): where an artifact was computed."""
        import torch
        d = {"device": self.device, "torch": torch.__version__, "deterministic": self.deterministic,
             # the CPU's kernels differ by instruction set: the same id computed on another CPU can differ in its bits
             "cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
             "threads": torch.get_num_threads(), "engine": self.executor,
             "workers": 1 if self.executor == "batched" else self.workers}  # batched: this process, whatever a file set
        if self.on_gpu:
            dev = self.torch_device
            d |= {"name": torch.cuda.get_device_name(dev), "cuda": torch.version.cuda,
                  "cudnn": torch.backends.cudnn.version()}
        return d


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


EXECUTOR: Kind[Executor] = Kind("executor", "executor", "--engine")


def free_cores() -> int:
    """`--workers auto`: the cores this process may run on (its CPU affinity, which a container's or a batch
    scheduler's limit sets) less those the rest of the machine keeps busy (the 1-minute load average, rounded), at
    least 1."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    busy = round(os.getloadavg()[0]) if hasattr(os, "getloadavg") else 0
    return max(1, min(usable, usable - busy))


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo; elsewhere what the platform says)."""
    import platform
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def round_options() -> tuple[str, ...]:
    """The runtime options of the commands (and pipeline sections) that run federated rounds."""
    return tuple(f.name for f in dataclasses.fields(Runtime) if f.metadata.get("scope") == ROUNDS)
