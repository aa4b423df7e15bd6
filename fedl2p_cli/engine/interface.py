"""The executors' shared check. What a pool runs (`Job`), the pool it opens (`Pool`) and the executor the catalog holds
(`Executor`) are declared on the bottom floor, fedl2p_cli/protocols.py, with the other pieces a plugin brings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import FedL2PError

if TYPE_CHECKING:
    from ..runtime import Runtime


def no_gpu_share(runtime: Runtime) -> None:
    """What every executor but Flower's refuses: a GPU share per client (`--gpus-per-client`)."""
    if runtime.gpus_per_client > 0:
        raise FedL2PError("--gpus-per-client is for --engine flower with a CUDA --device")
