"""The one place that decides where tensors live (as `fedl2p --threads` decides threads).

`fedl2p --device auto|cpu|cuda|cuda:N` (or FEDL2P_DEVICE, or `device = ...` at the top of a pipeline file) calls
`use()` once per process; stages read `current()` when they build a run's context; worker processes and Flower
ClientApps receive the same setting through `engine.workers.open_pool`. `core/` never calls this module: its
functions follow their inputs' device.

The device is not part of an artifact's id (like --workers and --engine, it says where the work ran, not what it
is); the manifest records it (`describe()`). A GPU run agrees with a CPU run to float32 rounding, not bit for bit;
`--deterministic` makes GPU runs repeat bit for bit.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from .errors import FedL2PError

ENV = "FEDL2P_DEVICE"
CHOICES = "auto | cpu | cuda | cuda:N"

_current = torch.device("cpu")   # library default: the CPU (every result bit-identical to earlier versions)
_deterministic = False
_explicit = False   # chosen by the user (--device, FEDL2P_DEVICE), so a pipeline file's `device` key does not override it


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
        raise FedL2PError(f"--device {spec.strip().lower()}: no CUDA device is available here (torch {torch.__version__}); use --device cpu")
    index = 0 if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise FedL2PError(f"--device {spec.strip().lower()}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)


def use(spec: str | torch.device = "auto", deterministic: bool = False, explicit: bool = True) -> torch.device:
    """Set this process's device and determinism. `deterministic`: cuDNN's deterministic kernels and
    torch.use_deterministic_algorithms, so a GPU run repeats bit for bit (CPU runs always do)."""
    global _current, _deterministic, _explicit
    _current = resolve(spec) if isinstance(spec, str) else spec
    _deterministic, _explicit = deterministic, explicit
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's reproducible workspace
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True)
    if _current.type == "cuda":
        torch.cuda.set_device(_current)
    return _current


def current() -> torch.device:
    return _current


def default_to(spec: str) -> None:
    """A pipeline file's `device`: used unless the user chose one on the command line or in FEDL2P_DEVICE."""
    if not _explicit:
        use(spec, _deterministic, explicit=False)
    else:
        parse(spec)  # overridden, but a misspelt key is still refused


def spec() -> tuple[str, bool]:
    """What a worker process or ClientApp needs to make the same choice (`use(*spec())`)."""
    return str(_current), _deterministic


def describe() -> dict:
    """For the manifest: where an artifact was computed."""
    d = {"device": str(_current), "torch": torch.__version__, "deterministic": _deterministic}
    if _current.type == "cuda":
        d |= {"name": torch.cuda.get_device_name(_current), "cuda": torch.version.cuda,
              "cudnn": torch.backends.cudnn.version()}
    return d


def move(obj: Any, dev: torch.device | str, non_blocking: bool = False) -> Any:
    """`obj` with every tensor on `dev` (dicts, lists, tuples and dataclasses walked; other values kept). On the
    device a tensor already has, the tensor itself is returned: a CPU run copies nothing."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dev, non_blocking=non_blocking)
    if isinstance(obj, dict):
        return {k: move(v, dev, non_blocking) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(move(v, dev, non_blocking) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: move(getattr(obj, f.name), dev, non_blocking)
                                           for f in dataclasses.fields(obj) if f.init})
    return obj


def to_host(obj: Any) -> Any:
    """A client's result, back on the CPU for aggregation, checkpoints and artifacts."""
    return move(obj, "cpu")


class RoundCache:
    """The server state of the round on the device, copied once per round however many clients this process runs
    (tasks of one round share the same dict object)."""

    def __init__(self) -> None:
        self._state: Any = None  # held, so its id cannot be reused by a later round's state
        self._value: Any = None

    def get(self, state: Any, dev: torch.device) -> Any:
        if dev.type == "cpu":
            return state
        if state is not self._state:
            self._state, self._value = state, move(state, dev)
        return self._value
