"""`--engine flower`: a round's client updates as Flower ClientApps in Flower's simulation runtime
(flower/simulation.py), an executor like the others (engine/executors.py), registered by builtin.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..engine.executors import no_client_batch
from ..errors import FedL2PError
from ..runtime import Job, Pool

if TYPE_CHECKING:
    from ..runtime import Runtime


@dataclass(frozen=True)
class Flower:
    """Flower's simulation runtime: `nodes` virtual SuperNodes, `--workers` ClientApps at a time, each given
    `--gpus-per-client` of a GPU."""
    name: str = "flower"
    about: str = "Flower simulation (pip install 'fedl2p[flower]')"

    def check(self, runtime: Runtime) -> None:
        if runtime.gpus_per_client > 0 and not runtime.on_gpu:
            raise FedL2PError("--gpus-per-client is for --engine flower with a CUDA --device")
        if runtime.on_gpu and runtime.gpus_per_client == 0:
            raise FedL2PError("--engine flower on a GPU needs --gpus-per-client (e.g. 0.25: four ClientApps per GPU)")
        no_client_batch(runtime, self.name)

    def open(self, job: Job) -> Pool:
        from .. import plugins
        from ..engine.workers import on_runtime
        from .simulation import FlowerPool
        from .wire import plugin_roots
        rt, sent = job.runtime, job.sent
        if rt.gpus_per_client > 0:  # Ray hands each ClientApp its GPU share as CUDA_VISIBLE_DEVICES
            sent = sent.replace(device="cuda")
        return FlowerPool(int(rt.workers), on_runtime, (sent.to_dict(), job.build, *job.args), job.update, job.nodes,
                          plugin_roots(plugins.of(rt)), rt.gpus_per_client, rt.timeout())
