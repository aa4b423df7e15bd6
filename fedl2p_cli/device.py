"""Devices: naming one (`parse`, `resolve`) and moving values to it (`move`, `to_host`).

Which device a run computes on is part of its `Runtime` (fedl2p_cli/runtime.py): `fedl2p --device auto|cpu|cuda|cuda:N`
(or FEDL2P_DEVICE, or `device = ...` at the top of a pipeline file) decides it once per command (`Runtime.resolved`,
the one caller of `resolve`), and stages, worker processes and Flower ClientApps receive it with the runtime. The
executors move work there (engine/placement.py); stages never call this module's movers, and `core/` never calls it:
its functions follow their inputs' device.

The device is not part of an artifact's id (it says where the work ran, not what it is); the manifest records it. A
GPU run agrees with a CPU run to float32 rounding, not bit for bit; `--deterministic` makes GPU runs repeat bit for bit.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from .errors import FedL2PError

ENV = "FEDL2P_DEVICE"
CHOICES = "auto | cpu | cuda | cuda:N"


def parse(spec: str) -> torch.device | None:
    """The device `spec` names (None for auto), refusing what is no cpu or cuda device name."""
    spec = spec.strip().lower()
    if spec == "auto":
        return None
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise FedL2PError(f"--device '{spec}' is not a device; choose {CHOICES}") from None
    if dev.type not in ("cpu", "cuda"):
        raise FedL2PError(f"--device '{spec}': only cpu and cuda are supported")
    return dev


def resolve(spec: str) -> torch.device:
    """`auto` is the first CUDA device when one is present, else the CPU; anything else must exist here."""
    dev = parse(spec)
    if dev is None:
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if dev.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise FedL2PError(f"--device {spec.strip().lower()}: no CUDA device is available here (torch {torch.__version__}); "
                          "use --device cpu")
    index = 0 if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise FedL2PError(f"--device {spec.strip().lower()}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)


def move(obj: Any, dev: torch.device | str, non_blocking: bool = False, *, place: bool = False) -> Any:
    """`obj` with every tensor on `dev` (dicts, lists, tuples and dataclasses walked; other values kept). On the
    device a tensor already has, the tensor itself is returned: a CPU run copies nothing. With `place` (an executor
    placing a context, engine/placement.py) a module is copied there (the caller's own stays where it is) and an
    object with `on_device(dev)` (a partition) answers for itself."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dev, non_blocking=non_blocking)
    if place and isinstance(obj, torch.nn.Module):
        return copy.deepcopy(obj).to(dev)
    if place and hasattr(obj, "on_device") and not isinstance(obj, type):
        return obj.on_device(torch.device(dev))
    if isinstance(obj, dict):
        return {k: move(v, dev, non_blocking, place=place) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(move(v, dev, non_blocking, place=place) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: move(getattr(obj, f.name), dev, non_blocking, place=place)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


def to_host(obj: Any) -> Any:
    """A client's result, back on the CPU for aggregation, checkpoints and artifacts."""
    return move(obj, "cpu")
