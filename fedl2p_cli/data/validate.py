"""The one check of every dataset a source returns (built-in or a plugin's), where it enters: `sources.load`.

A dataset the rest of fedl2p can trust holds uint8 images [N, C, H, W] (or float ones in [0, 1], stored as uint8:
round(255 x)), N integer labels in [0, classes), normalisation constants per channel in the units of [0, 1] images,
finite values, and a domain (or group) per image naming one of its domain (group) names. Each fault is one line
naming the dataset, the plugin that provided it and the field."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..errors import DataError

if TYPE_CHECKING:
    from ..catalog import Plugin
    from ..configs import PartitionConfig
    from ..protocols import Source
    from .datasets import Dataset


class Fault(DataError):
    """A dataset that breaks the contract above (one line; the CLI exits 2)."""


def check(ds: Any, src: Source, cfg: PartitionConfig, owner: Plugin | None) -> Dataset:
    """`ds` as the rest of fedl2p expects it (float images in [0, 1] become uint8), or one line naming the fault and
    the source's `owner` (None: an unregistered source)."""
    from .datasets import Dataset

    def fault(field: str, what: str) -> Fault:
        who = "an unregistered source" if owner is None else owner.describe()
        return Fault(f"dataset '{src.name}' from {who}: {field} {what}")

    if not isinstance(ds, Dataset):
        raise fault("load()", f"returned {type(ds).__name__}, not a fedl2p_cli.data.datasets.Dataset")
    images = _images(ds.images, fault)
    n, c = images.shape[:2]
    labels = _index_array(ds.labels, n, "labels", fault)
    _names(ds.classes, "classes", fault)
    if labels.numel() and int(labels.max()) >= len(ds.classes):
        raise fault("labels", f"hold {int(labels.max())}, but there are {len(ds.classes)} classes (labels run from 0 "
                    f"to {len(ds.classes) - 1})")
    ds.mean, ds.std = _constants(ds.mean, ds.std, c, fault)
    for field, names in (("domains", "domain_names"), ("groups", "group_names")):
        _groups(ds, field, names, n, fault)
    if src.channels is not None and c != src.channels:
        raise fault("images", f"have {c} channels; the source declares {src.channels}")
    if src.classes is not None and len(ds.classes) != src.classes:
        raise fault("classes", f"number {len(ds.classes)}; the source declares {src.classes}")
    if n < cfg.clients and ds.groups is None:
        raise fault("images", f"number {n}; --clients {cfg.clients} needs at least one sample for each client")
    ds.images, ds.labels = images, labels
    return ds


def _images(x: Any, fault) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise fault("images", f"is a {type(x).__name__}; give a torch.Tensor (torch.from_numpy(array))")
    if x.ndim != 4:
        hint = " (a single channel: images[:, None])" if x.ndim == 3 else ""
        raise fault("images", f"has shape {tuple(x.shape)}; it must be (N, C, H, W){hint}")
    if min(x.shape) == 0:
        raise fault("images", f"has shape {tuple(x.shape)}; no axis may be empty")
    if x.dtype == torch.uint8:
        return x
    if not x.is_floating_point():
        raise fault("images", f"are {str(x.dtype).removeprefix('torch.')}; give uint8 (0..255) or float in [0, 1]")
    if not bool(torch.isfinite(x).all()):
        raise fault("images", "hold NaN or infinite values")
    lo, hi = float(x.min()), float(x.max())
    if lo < 0 or hi > 1:
        hint = " (0..255 values: images.to(torch.uint8))" if lo >= 0 and hi <= 255 else ""
        raise fault("images", f"are {str(x.dtype).removeprefix('torch.')} in [{lo:.4g}, {hi:.4g}]; float images must "
                    f"be in [0, 1]{hint}")
    return (x.double() * 255).round().to(torch.uint8)  # [0, 1] -> 0..255, as partition.h5 stores images


def _index_array(t: Any, n: int, field: str, fault) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise fault(field, f"is a {type(t).__name__}; give a torch.Tensor")
    if t.ndim != 1:
        raise fault(field, f"has shape {tuple(t.shape)}; it must be one value per image, ({n},)")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise fault(field, f"are {str(t.dtype).removeprefix('torch.')}; give integers (torch.int64)")
    if len(t) != n:
        raise fault(field, f"number {len(t)}, images {n}; there must be one per image")
    if len(t) and int(t.min()) < 0:
        raise fault(field, f"hold {int(t.min())}; they must be >= 0")
    return t.to(torch.int64)


def _names(names: Any, field: str, fault) -> None:
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(v, str) for v in names):
        raise fault(field, f"is {names!r}; give a non-empty list of names (str)")
    if len(set(names)) != len(names):
        raise fault(field, "name one twice")


def _constants(mean: Any, std: Any, c: int, fault) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and SD of the images scaled to [0, 1] (what datasets.normalize subtracts and divides by)."""
    out = []
    for field, v in (("mean", mean), ("std", std)):
        try:
            vals = tuple(float(a) for a in v)
        except (TypeError, ValueError):
            raise fault(field, f"is {v!r}; give one number per channel") from None
        if len(vals) != c:
            raise fault(field, f"has {len(vals)} values for {c} channels")
        bad = [a for a in vals if not 0 <= a <= 1 or (field == "std" and a == 0)]
        if bad:
            want = "in (0, 1]" if field == "std" else "in [0, 1]"
            raise fault(field, f"holds {bad[0]:g}; it is in the units of images scaled to [0, 1] (pixel / 255), so "
                        f"{want}")
        out.append(vals)
    return out[0], out[1]


def _groups(ds: Dataset, field: str, names_field: str, n: int, fault) -> None:
    t, names = getattr(ds, field), getattr(ds, names_field)
    if t is None:
        return
    setattr(ds, field, _index_array(t, n, field, fault))
    _names(names, names_field, fault)
    top = int(getattr(ds, field).max())
    if top >= len(names):
        raise fault(field, f"hold {top}, but there are {len(names)} {names_field} (ids run from 0 to {len(names) - 1})")
