"""A dataset read from a user's `.npz` file: arrays `x` (images), `y` (integer labels) and optionally `domain` (one
domain per image, integers or strings), and optionally `classes` (names). Images may be uint8 [N, H, W],
[N, H, W, C] or [N, C, H, W] (C of 1 or 3), or floats in [0, 1]; they are kept at their own size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedl2p_cli.api import DataError, Dataset, channel_stats


def load_npz(path: Path | None) -> Dataset:
    """The arrays of `path` as a fedl2p dataset; a bad file is one `DataError` naming what is wrong."""
    if path is None or not Path(path).is_file():
        raise DataError(f"npz needs --data-dir pointing at a .npz file with arrays x and y (got {path})")
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError) as e:
        raise DataError(f"{path} is not a readable .npz file without pickled objects ({e})") from None
    for k in ("x", "y"):
        if k not in arrays:
            raise DataError(f"{path} has no array '{k}' (it has: {', '.join(arrays) or 'none'})")
    images, labels = to_images(arrays["x"], path), to_labels(arrays["y"], len(arrays["x"]), path)
    classes = [str(c) for c in arrays["classes"]] if "classes" in arrays else [str(i) for i in range(int(labels.max()) + 1)]
    if len(classes) <= int(labels.max()):
        raise DataError(f"{path}: y has label {int(labels.max())} but 'classes' names only {len(classes)}")
    mean, std = channel_stats(images)
    domains, names = to_domains(arrays.get("domain"), len(labels), path)
    return Dataset("npz", images, labels, classes, mean, std, domains, names)


def to_images(x: np.ndarray, path: Path) -> torch.Tensor:
    """uint8 [N, C, H, W] from any of the accepted layouts."""
    if x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
        x = x.transpose(0, 3, 1, 2)
    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise DataError(f"{path}: x must be [N, H, W], [N, H, W, C] or [N, C, H, W] with C 1 or 3, got {x.shape}")
    if np.issubdtype(x.dtype, np.floating):
        if x.min() < 0 or x.max() > 1:
            raise DataError(f"{path}: float images must lie in [0, 1], got [{x.min():.3g}, {x.max():.3g}]")
        x = np.round(x * 255)
    elif x.dtype != np.uint8:
        raise DataError(f"{path}: x must be uint8 or float in [0, 1], got {x.dtype}")
    return torch.from_numpy(np.ascontiguousarray(x.astype(np.uint8)))


def to_labels(y: np.ndarray, n: int, path: Path) -> torch.Tensor:
    if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer) or (n and y.min() < 0):
        raise DataError(f"{path}: y must be {n} non-negative integers (one per image), got {y.dtype} {y.shape}")
    return torch.from_numpy(y.astype(np.int64))


def to_domains(d: np.ndarray | None, n: int, path: Path) -> tuple[torch.Tensor | None, list[str] | None]:
    """Domain ids and names (sorted unique values), or (None, None) without a `domain` array."""
    if d is None:
        return None, None
    if d.shape != (n,):
        raise DataError(f"{path}: domain must hold one value per image ({n}), got shape {d.shape}")
    names, ids = np.unique(d.astype(str) if d.dtype.kind in "US" else d, return_inverse=True)
    return torch.from_numpy(ids.astype(np.int64)), [str(v) for v in names]
