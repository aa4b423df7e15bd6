"""Datasets as in-memory uint8 tensors with their normalisation constants.

Every loader returns a `Dataset` whose images are `uint8 [N, C, H, W]`; `normalize` turns a batch
into float32 network input. Nothing downloads unless the caller allows it and a network exists.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError
from ..protocols import Dataset
from . import provision
from .provision import DEBIAN_FMNIST, ENV_DATA

FMNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def normalize(images: torch.Tensor, mean, std, dtype=torch.float32) -> torch.Tensor:
    """uint8 [N,C,H,W] -> standardised float."""
    m = torch.as_tensor(mean, dtype=dtype, device=images.device).view(1, -1, 1, 1)
    s = torch.as_tensor(std, dtype=dtype, device=images.device).view(1, -1, 1, 1)
    return (images.to(dtype) / 255.0 - m) / s


def channel_stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and standard deviation of uint8 images [N, C, H, W], in [0, 1] units."""
    x = images.to(torch.float64) / 255.0
    return tuple(x.mean(dim=(0, 2, 3)).tolist()), tuple(x.std(dim=(0, 2, 3)).clamp_min(1e-3).tolist())


def pad_to(images: torch.Tensor, size: int) -> torch.Tensor:
    h, w = images.shape[-2:]
    if h >= size and w >= size:
        return images
    ph, pw = size - h, size - w
    return torch.nn.functional.pad(images, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))


# -- Fashion-MNIST ------------------------------------------------------------------------------

def _read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _find_fmnist(data_dir: Path | None) -> Path:
    if data_dir is not None and not data_dir.is_dir():  # an explicit folder is never silently replaced by another
        raise DataError(f"--data-dir {data_dir} does not exist")
    if data_dir is None:  # the Debian package's folder: installed now if it is missing and apt-get may be used
        if provision.complete(DEBIAN_FMNIST) or provision.install_fmnist(DEBIAN_FMNIST):
            return DEBIAN_FMNIST
        raise DataError(provision.missing_line(DEBIAN_FMNIST))
    candidates = [data_dir, data_dir / "fashion-mnist", data_dir / "FashionMNIST" / "raw"]
    for c in candidates:
        if provision.complete(c):
            return c
    raise DataError(f"Fashion-MNIST not found (looked in {', '.join(str(c) for c in candidates)}): put the four IDX "
                    "files (train/t10k images/labels, .gz or not) in that folder")


def load_fmnist(data_dir: Path | None = None, download: bool = False) -> Dataset:
    try:
        root = _find_fmnist(data_dir)
    except DataError:
        if not download:
            raise
        root = _download_fmnist(data_dir or Path("data"))

    def read(n: str) -> np.ndarray:
        p = root / n
        return _read_idx(p if p.exists() else root / f"{n}.gz")

    x = np.concatenate([read("train-images-idx3-ubyte"), read("t10k-images-idx3-ubyte")])
    y = np.concatenate([read("train-labels-idx1-ubyte"), read("t10k-labels-idx1-ubyte")])
    images = pad_to(torch.from_numpy(x.copy()).unsqueeze(1), 32)
    return Dataset("fmnist", images, torch.from_numpy(y.astype(np.int64)), FMNIST_CLASSES, (0.2860,), (0.3530,))


def _download_fmnist(root: Path) -> Path:
    try:
        from torchvision.datasets import FashionMNIST
        FashionMNIST(str(root), train=True, download=True)
        FashionMNIST(str(root), train=False, download=True)
    except Exception as e:  # no network: say where to put the files
        raise DataError(f"Fashion-MNIST download failed ({e.__class__.__name__}); provide the IDX files with --data-dir") from None
    return root / "FashionMNIST" / "raw"


# -- sklearn digits (tiny, bundled) -------------------------------------------------------------

def load_digits_dataset() -> Dataset:
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.from_numpy((d.images / 16.0 * 255.0).round().astype(np.uint8)).unsqueeze(1)  # 8x8
    x = torch.nn.functional.interpolate(x.float(), size=(16, 16), mode="nearest").to(torch.uint8)
    mean, std = channel_stats(x)
    return Dataset("digits", x, torch.from_numpy(d.target.astype(np.int64)), [str(i) for i in range(10)], mean, std)


# -- CIFAR-10 and CIFAR-10-C ------------------------------------------------------------------

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def load_cifar10(data_dir: Path | None, download: bool = False) -> Dataset:
    from torchvision.datasets import CIFAR10
    root = data_dir or Path("data")
    try:
        tr = CIFAR10(str(root), train=True, download=download)
        te = CIFAR10(str(root), train=False, download=download)
    except Exception as e:
        raise DataError(f"CIFAR-10 not found under {root} ({e.__class__.__name__}); pass --data-dir with cifar-10-batches-py "
                        "or --download where a network exists") from None
    x = np.concatenate([tr.data, te.data]).transpose(0, 3, 1, 2)
    y = np.concatenate([tr.targets, te.targets]).astype(np.int64)
    return Dataset("cifar10", torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y), CIFAR10_CLASSES, CIFAR_MEAN, CIFAR_STD)


CIFAR10C_TYPES = ["gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
                  "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression"]


def load_cifar10_c(data_dir: Path | None, corruptions: list[str], severity: int) -> Dataset:
    """The official CIFAR-10-C folder: `<type>.npy` (50000 = 5 severities x 10000) and `labels.npy`."""
    if data_dir is None:
        raise DataError("cifar10-c needs --data-dir pointing at the CIFAR-10-C folder (<type>.npy, labels.npy)")
    root = Path(data_dir)
    if not (root / "labels.npy").exists() and (root / "CIFAR-10-C").is_dir():
        root = root / "CIFAR-10-C"
    if not (root / "labels.npy").exists():
        raise DataError(f"CIFAR-10-C not found: {root}/labels.npy is missing")
    if not 1 <= severity <= 5:
        raise DataError(f"CIFAR-10-C severity must be 1..5, got {severity}")
    lo, hi = (severity - 1) * 10000, severity * 10000
    labels = np.load(root / "labels.npy")[lo:hi].astype(np.int64)
    xs, ys, ds = [], [], []
    for d, c in enumerate(corruptions):
        f = root / f"{c}.npy"
        if not f.exists():
            raise DataError(f"CIFAR-10-C corruption '{c}' not found ({f})")
        xs.append(np.load(f, mmap_mode="r")[lo:hi].transpose(0, 3, 1, 2))
        ys.append(labels)
        ds.append(np.full(len(labels), d))
    return Dataset("cifar10-c", torch.from_numpy(np.ascontiguousarray(np.concatenate(xs))), torch.from_numpy(np.concatenate(ys)),
                   CIFAR10_CLASSES, CIFAR_MEAN, CIFAR_STD, torch.from_numpy(np.concatenate(ds)), list(corruptions))


# -- multi-domain image folders (Office-Caltech-10, DomainNet) ---------------------------------

IMG_EXT = {".jpg", ".jpeg", ".png", ".bmp"}


def load_image_folder(data_dir: Path | None, size: int | None = None) -> Dataset:
    """`ROOT/<domain>/<class>/<image>`; classes are the union of class folders. Images keep their size (all must share
    one) unless `size` is given: then each is resized to size x size."""
    if data_dir is None or not Path(data_dir).is_dir():
        raise DataError(f"image-folder needs --data-dir with ROOT/<domain>/<class>/<image> (got {data_dir})")
    from PIL import Image
    root = Path(data_dir)
    domains = sorted(p.name for p in root.iterdir() if p.is_dir())
    classes = sorted({c.name for d in domains for c in (root / d).iterdir() if c.is_dir()})
    if not domains or not classes:
        raise DataError(f"no <domain>/<class>/ folders under {root}")
    xs, ys, ds, sizes = [], [], [], set()
    for di, d in enumerate(domains):
        for ci, c in enumerate(classes):
            folder = root / d / c
            if not folder.is_dir():
                continue
            for f in sorted(folder.iterdir()):
                if f.suffix.lower() in IMG_EXT:
                    img = Image.open(f).convert("RGB")
                    sizes.add(img.size)
                    xs.append(np.asarray(img if size is None else img.resize((size, size))).transpose(2, 0, 1))
                    ys.append(ci)
                    ds.append(di)
    if not xs:
        raise DataError(f"no images under {root}")
    if size is None and len(sizes) > 1:
        a, b = sorted(sizes)[:2]
        raise DataError(f"image-folder: the images have {len(sizes)} sizes (e.g. {a[0]}x{a[1]} and {b[0]}x{b[1]}); pass "
                        "--image-size N to resize every image to N x N")
    x = torch.from_numpy(np.stack(xs))
    mean, std = channel_stats(x)
    (w, h), = sizes if size is None else [(size, size)]
    note = (f"kept {len(xs)} images at their size, {w}x{h}" if size is None else
            f"resized {len(xs)} images ({len(sizes)} size{'s' if len(sizes) > 1 else ''}) to {size}x{size} (--image-size)")
    return Dataset("image-folder", x, torch.tensor(ys), classes, mean, std, torch.tensor(ds), domains, note=note)


def env_data_dir() -> Path | None:
    return Path(os.environ[ENV_DATA]) if ENV_DATA in os.environ else None
