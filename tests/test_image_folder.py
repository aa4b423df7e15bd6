"""image-folder as a registered source: the images keep their size unless --image-size is given, the partition says
which it did, mixed sizes without --image-size are one line, and --image-size 64 (what every image-folder partition
was resized to before the option existed) keeps those partitions' ids."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from fedl2p_cli.artifacts import Store
from fedl2p_cli.configs import PartitionConfig
from fedl2p_cli.errors import FedL2PError
from fedl2p_cli.stages import partition

from .helpers import execute


def folder(root, size=(20, 12), odd=None):
    rng = np.random.default_rng(0)
    for d in ("siteA", "siteB"):
        for c in ("cat", "dog"):
            (root / d / c).mkdir(parents=True)
            for i in range(6):
                w, h = odd if (odd and d == "siteB" and i == 0) else size
                Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / d / c / f"{i}.png")
    return root


def cfg(root, **kw) -> PartitionConfig:
    return PartitionConfig(dataset="image-folder", data_dir=str(root), clients=2, samples_per_client=10, alpha=1000,
                           unseen_fraction=0.0, **kw)


def test_image_folder_keeps_the_size_or_resizes_when_asked(tmp_path):
    root, store = folder(tmp_path / "imgs"), Store(tmp_path / "s")
    kept, _ = execute(partition, cfg(root), store, plot=False)
    _, p = partition.load(store, kept.id)
    assert tuple(p.images.shape[1:]) == (3, 12, 20) and kept.metrics["source"] == "kept 24 images at their size, 20x12"
    assert kept.config["image_size"] is None  # a new id: before --image-size, image-folder always resized to 64
    small, _ = execute(partition, cfg(root, image_size=8), store, plot=False)
    _, p = partition.load(store, small.id)
    assert tuple(p.images.shape[1:]) == (3, 8, 8) and "resized 24 images (1 size) to 8x8" in small.metrics["source"]
    legacy, _ = execute(partition, cfg(root, image_size=64), store, plot=False)
    assert "image_size" not in legacy.config  # the older artifacts' id


def test_mixed_sizes_need_image_size(tmp_path):
    root = folder(tmp_path / "imgs", odd=(16, 16))
    with pytest.raises(FedL2PError, match="the images have 2 sizes .* pass --image-size N"):
        execute(partition, cfg(root), Store(tmp_path / "s"), plot=False)
    assert not (tmp_path / "s" / "partition").exists()
    art, _ = execute(partition, cfg(root, image_size=10), Store(tmp_path / "s"), plot=False)
    assert "(2 sizes) to 10x10" in art.metrics["source"]


def test_image_size_applies_to_image_folder_only(tmp_path):
    with pytest.raises(FedL2PError, match="--image-size does not apply to --dataset digits"):
        execute(partition, PartitionConfig(dataset="digits", image_size=8), Store(tmp_path / "s"), plot=False)
