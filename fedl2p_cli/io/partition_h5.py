"""`partition.h5`: the clients' pixels, labels and splits, self-contained (no dataset needed later).

Layout (readable with plain h5py):
  attrs: dataset, num_classes, mean, std (JSON lists), classes, domain_names (JSON), seed, alpha
  /images       uint8 [N, C, H, W]  every sample any client owns, client by client, train|val|test
  /labels       int64 [N]
  /source_index int64 [N]           index into the source dataset (provenance; unique within a domain)
  /offsets      int64 [clients, 4]  client c: train = [o0,o1), val = [o1,o2), test = [o2,o3)
  /domain       int64 [clients]     domain id per client (index into domain_names)
  /unseen       bool  [clients]     True: never used for pretraining or meta-training
  /label_hist   int64 [clients, num_classes]  over the client's train+val+test samples
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import h5py
import numpy as np
import torch

from ..core.client import ClientData
from ..data.datasets import normalize


@dataclass
class Partition:
    dataset: str
    images: torch.Tensor
    labels: torch.Tensor
    source_index: torch.Tensor
    offsets: np.ndarray
    domain: np.ndarray
    unseen: np.ndarray
    label_hist: np.ndarray
    classes: list[str]
    domain_names: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    attrs: dict = field(default_factory=dict)
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def num_clients(self) -> int:
        return len(self.domain)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def in_channels(self) -> int:
        return int(self.images.shape[1])

    @property
    def image_size(self) -> int:
        return int(self.images.shape[-1])

    def pool(self, unseen: bool) -> list[int]:
        return [int(i) for i in np.nonzero(self.unseen == unseen)[0]]

    def client(self, c: int) -> ClientData:
        """Normalised tensors of client `c`, built once and cached."""
        if c not in self._cache:
            self._cache[c] = self._slice(c, self.images, self.labels)
        return self._cache[c]

    def on_device(self, device: torch.device) -> Partition:
        """This partition as an executor places it on `device` (engine/placement.py): its uint8 pixels and labels
        copied there once, so each client's tensors are sliced and normalised there (no host traffic per update)."""
        return replace(self, images=self.images.to(device), labels=self.labels.to(device), _cache={})

    def client_on(self, c: int, device: torch.device) -> ClientData:
        """Client `c`'s tensors on `device`, for a plugin system that places its own tensors (the package's own
        stages read a partition an executor placed)."""
        if device.type == "cpu":
            return self.client(c)
        if (key := f"on:{device}") not in self._cache:
            self._cache[key] = self.on_device(device)
        return self._cache[key].client(c)

    def _slice(self, c: int, images: torch.Tensor, labels: torch.Tensor) -> ClientData:
        o = self.offsets[c]
        x = normalize(images[o[0]:o[3]], self.mean, self.std)
        y = labels[o[0]:o[3]]
        cut = [int(v - o[0]) for v in o]
        return ClientData(*[(x[a:b], y[a:b]) for a, b in zip(cut[:-1], cut[1:])])


def write(path: Path, p: Partition) -> None:
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=p.images.numpy(), compression="gzip", compression_opts=1, chunks=True)
        for name, arr in [("labels", p.labels.numpy()), ("source_index", p.source_index.numpy()), ("offsets", p.offsets),
                          ("domain", p.domain), ("unseen", p.unseen), ("label_hist", p.label_hist)]:
            f.create_dataset(name, data=arr)
        f.attrs["dataset"] = p.dataset
        f.attrs["num_classes"] = p.num_classes
        f.attrs["classes"] = json.dumps(p.classes)
        f.attrs["domain_names"] = json.dumps(p.domain_names)
        f.attrs["mean"] = json.dumps(list(p.mean))
        f.attrs["std"] = json.dumps(list(p.std))
        for k, v in p.attrs.items():
            f.attrs[k] = v


def read(path: Path) -> Partition:
    with h5py.File(path, "r") as f:
        return Partition(
            dataset=str(f.attrs["dataset"]),
            images=torch.from_numpy(f["images"][...]),
            labels=torch.from_numpy(f["labels"][...]),
            source_index=torch.from_numpy(f["source_index"][...]),
            offsets=f["offsets"][...], domain=f["domain"][...], unseen=f["unseen"][...].astype(bool),
            label_hist=f["label_hist"][...], classes=json.loads(f.attrs["classes"]),
            domain_names=json.loads(f.attrs["domain_names"]),
            mean=tuple(json.loads(f.attrs["mean"])), std=tuple(json.loads(f.attrs["std"])),
            attrs={k: f.attrs[k] for k in f.attrs if k not in ("classes", "domain_names", "mean", "std")},
        )
