"""Datasets by name: each a registered `Source` (the built-ins in data/builtin_sources.py, a plugin's through
`registry.add_dataset`). The partition stage asks the source, never the dataset's name, what it can do: how to load
it, whether --corruptions generates domains from it, which CIFAR-10-C-like files its domains are, whether its clients
are natural groups (a speaker each), which partition options apply."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import protocols
from ..catalog import DATASET, Catalog
from ..errors import DataError, FedL2PError

if TYPE_CHECKING:
    from ..configs import PartitionConfig
    from ..protocols import Dataset

OPTIONS = ("image_size",)  # partition options a source takes only when it says so (`Source.options`)


@dataclass(frozen=True)
class Source:
    """A dataset: `load(cfg, data_dir)` returns a `datasets.Dataset` (uint8 images [N, C, H, W], labels, class names,
    normalisation constants, optional domains or groups); `data_dir` is --data-dir (or FEDL2P_DATA; None if neither).
    The rest describes it: `channels`, `classes` (None: whatever the loader returns; else checked), `mean`/`std`
    (None: the loader's), and how a partition may use it."""
    name: str
    load: Callable[[PartitionConfig, Path | None], Dataset]
    about: str = ""
    channels: int | None = None
    classes: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    domains: tuple[str, ...] | None = None   # generated corruption domains it always has (fmnist-c), default names
    corruptible: bool = False                # --corruptions generates domains from its images (fmnist, cifar10)
    corruption_files: tuple[str, ...] = ()   # --corruptions names its own domain files instead (cifar10-c)
    images_of: str | None = None             # the source whose images it holds (fmnist-c: fmnist), for --exclude
    speakers: bool = False                   # clients are the dataset's speakers, one each (Speech Commands)
    options: tuple[str, ...] = ()            # which of OPTIONS it takes (image-folder: image_size)
    resized_before: int | None = None        # the --image-size its artifacts made before the option had (their ids)
    # the files `load` reads, for the data fingerprint's cache (data/fingerprint.py); None: the --data-dir file or folder
    reads: Callable[[PartitionConfig, Path | None], list[Path]] | None = None

    def read_paths(self, cfg: PartitionConfig, data_dir: Path | None) -> list[Path]:
        """What `load` reads (a folder: every file below it); [] where that is not known (nothing is cached)."""
        if self.reads is not None:
            return list(self.reads(cfg, data_dir))
        return [data_dir] if data_dir is not None else []

    def generates(self, corruptions: list[str] | None) -> bool:
        """Whether a partition's domains are corruptions generated from these images."""
        return self.domains is not None or (corruptions is not None and self.corruptible)

    def base(self) -> str:
        return self.images_of or self.name


def names(catalog: Catalog) -> tuple[str, ...]:
    return tuple(catalog.names(DATASET))


def get(name: str, catalog: Catalog) -> protocols.Source:
    return catalog.get(DATASET, name)


def load(cfg: PartitionConfig, data_dir: Path | None, catalog: Catalog) -> Dataset:
    """The source's dataset, checked against the dataset contract and what the source declares (data/validate.py)."""
    from . import validate
    src = get(cfg.dataset, catalog)
    owner = catalog.owner(DATASET, src.name)
    try:
        ds = src.load(cfg, data_dir)
    except FedL2PError:
        raise
    except Exception as e:  # noqa: BLE001 - a plugin's loader failing (its file missing, its bug): one line naming it
        if owner is None or owner.builtin:
            raise
        raise DataError(f"dataset '{src.name}' from {owner.describe()}: its load() raised {e.__class__.__name__}: {e}") from None
    if src.mean is not None and hasattr(ds, "mean"):
        ds.mean, ds.std = src.mean, src.std  # type: ignore[assignment]  # validate.check refuses a std left None
    return validate.check(ds, src, cfg, owner)
