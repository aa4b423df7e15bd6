"""Tensor dicts on disk as safetensors (no pickle); `torch.save` files only through weights_only=True."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ..errors import ArtifactError, FedL2PError


def save(path: Path, tensors: dict[str, torch.Tensor], meta: dict | None = None) -> None:
    """Atomic: write beside, then replace."""
    tmp = path.with_name(path.name + ".part")
    save_file({k: v.detach().cpu().clone().contiguous() for k, v in tensors.items()}, str(tmp),  # no shared storage
              metadata={"meta": json.dumps(meta or {})})
    os.replace(tmp, path)


def load(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except Exception as e:
        raise ArtifactError(f"cannot read weights {path}: {e.__class__.__name__}") from None


def load_with_meta(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Tensors and the JSON metadata written by `save` (one file: both come from the same atomic write)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("meta", "{}"))
            # fresh allocations: a tensor read from the file can sit at another memory alignment than the one
            # the uninterrupted run computed with, and vectorised kernels then round differently (seen: 1 ulp)
            return {k: f.get_tensor(k).clone() for k in f.keys()}, meta  # noqa: SIM118 -- safe_open is not a dict and not iterable
    except Exception as e:
        raise ArtifactError(f"cannot read checkpoint {path}: {e.__class__.__name__}") from None


def raw_metadata(path: Path) -> dict[str, str]:
    """A safetensors file's own string metadata (what any safetensors library writes with `metadata=`)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception as e:
        raise ArtifactError(f"cannot read {path}: {e.__class__.__name__}") from None


def import_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """A state dict trained elsewhere: safetensors, or a torch.save file read with weights_only=True."""
    if not path.is_file():
        raise FedL2PError(f"--init file not found: {path}")
    if path.suffix == ".safetensors":
        return load(path)
    try:
        with warnings.catch_warnings():  # torch warns on stderr about a file's pickle protocol before refusing it:
            warnings.simplefilter("ignore", UserWarning)  # the user gets our one line instead
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise FedL2PError(f"--init {path} is not a weights-only state dict ({e.__class__.__name__})") from None
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise FedL2PError(f"--init {path} does not hold a state dict of tensors")
    return {k.removeprefix("module."): v for k, v in obj.items() if not k.endswith("num_batches_tracked")}
