"""Where a round's client updates run: each executor is a catalog entry (kind "executor", `--engine NAME`) behind one
interface, registered through the plugin registry like a model or a method (`registry.add_executor`).

An executor checks the runtime options it reads (`check`, before anything runs) and opens a pool for one stage run
(`open`): the pool maps a round's tasks to their results in task order (a client that failed comes back as
`rounds.Failed`), and is closed when the stage ends. The round loop (engine.rounds) never asks which executor it has.
The built-ins: `local` (this process, or `--workers` processes), `batched` (clients in vmapped groups,
engine/batched.py) and `flower` (Flower's simulation runtime, fedl2p_cli/flower/executor.py). Adding one (Ray, say)
is one module with a class like these and one registration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import FedL2PError
from ..runtime import EXECUTOR, Executor, Job, Pool
from .interface import no_gpu_share

if TYPE_CHECKING:
    from ..catalog import Catalog
    from ..runtime import Runtime


@dataclass(frozen=True)
class Local:
    """This process (`--workers 1`), or `--workers` processes of one torch thread each."""
    name: str = "local"
    about: str = "this process, or --workers processes of one torch thread each"

    def check(self, runtime: Runtime) -> None:
        no_gpu_share(runtime)
        no_client_batch(runtime, self.name)

    def open(self, job: Job) -> Pool:
        from .workers import ClientPool, on_runtime
        rt = job.runtime
        return ClientPool(int(rt.workers), on_runtime, (job.sent.to_dict(), job.build, *job.args), job.update,
                          job.local_context, rt.torch_device, rt.timeout())


def no_client_batch(runtime: Runtime, name: str) -> None:
    if runtime.client_batch not in ("auto", 1):
        raise FedL2PError(f"--client-batch is for --engine batched (this run's engine: {name})")


def open_pool(runtime: Runtime, build: Callable[..., Any], args: tuple, update: Callable[..., Any],
              local_context: Any, nodes: int, update_many: Callable[..., list[Any]] | None = None) -> Pool:
    """The pool of a stage run's client updates, from the executor `runtime.executor` names. Every process computes on
    the runtime's device; each builds its context as `build(*args, runtime)`. A client that fails or gives no reply
    within the round timeout comes back as `rounds.Failed`. `update_many`: the stage's group update, for executors
    that batch clients (`engine.batched`)."""
    from .. import plugins
    catalog = plugins.of(runtime)
    sent = runtime.replace(plugins=tuple(dict.fromkeys((*runtime.plugins, *catalog.active()))),
                           allow_import=tuple(dict.fromkeys((*runtime.allow_import, *catalog.allowed))))
    return get(runtime.executor, catalog).open(Job(runtime, sent, build, args, update, local_context, nodes, update_many))


def get(name: str, catalog: Catalog) -> Executor:
    """The executor registered as `name` in `catalog` (UnknownName naming the choices, for --engine)."""
    return catalog.get(EXECUTOR, name)
