"""The built-in datasets as registered sources (fedl2p_cli/builtin.py registers them like a plugin's)."""

from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

from . import corruptions as corr
from . import datasets, speech, synth_speech
from .sources import Source

FMNIST: dict[str, Any] = {"channels": 1, "classes": 10, "mean": (0.2860,), "std": (0.3530,)}
CIFAR: dict[str, Any] = {"channels": 3, "classes": 10, "mean": datasets.CIFAR_MEAN, "std": datasets.CIFAR_STD}


def _fmnist(cfg, data_dir):
    return datasets.load_fmnist(data_dir, cfg.download)


def _digits(cfg, data_dir):
    return datasets.load_digits_dataset()


def _cifar10(cfg, data_dir):
    return datasets.load_cifar10(data_dir, cfg.download)


def _cifar10_c(cfg, data_dir):
    return datasets.load_cifar10_c(data_dir, cfg.corruptions or datasets.CIFAR10C_TYPES[:10], cfg.severity)


def _image_folder(cfg, data_dir):
    return datasets.load_image_folder(data_dir, cfg.image_size)


def _speech_commands(cfg, data_dir):
    seen, unseen = cfg.speakers()
    return speech.load_speech_commands(data_dir, seen, unseen, cfg.spectrogram, cfg.seed)


def _speech_synth(cfg, data_dir):
    seen, unseen = cfg.speakers()
    with tempfile.TemporaryDirectory(prefix="fedl2p-speech-") as tmp:  # a quarter more speakers than chosen per pool
        synth_speech.generate(Path(tmp), math.ceil(1.25 * seen), math.ceil(1.25 * unseen), cfg.seed)
        return speech.load_speech_commands(Path(tmp), seen, unseen, cfg.spectrogram, cfg.seed, name="speech-synth")


def _debian_or_dir(cfg, data_dir):
    return [data_dir if data_dir is not None else datasets.DEBIAN_FMNIST]


def _sklearn_digits(cfg, data_dir):
    import sklearn.datasets
    return [Path(sklearn.datasets.__file__).parent / "data" / "digits.csv.gz"]


def _espeak(cfg, data_dir):
    """speech-synth's clips are espeak-ng's output: the program and its voice data."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        return []
    return [Path(exe).resolve(), *Path("/usr/lib").glob("*/espeak-ng-data"), *Path("/usr/share").glob("espeak-ng-data")]


SOURCES = (
    Source("fmnist", _fmnist, "Fashion-MNIST (70000 images, padded to 32x32)", **FMNIST, corruptible=True, reads=_debian_or_dir),
    Source("fmnist-c", _fmnist, "Fashion-MNIST with generated corruption domains", **FMNIST,
           domains=tuple(corr.DEFAULT_DOMAINS), corruptible=True, images_of="fmnist", reads=_debian_or_dir),
    Source("fmnist-r", _fmnist, "Fashion-MNIST with rotation domains (10 angles 0..180, CAFeMe's RMNIST analogue)",
           **FMNIST, domains=tuple(corr.ROTATION_DOMAINS), corruptible=True, images_of="fmnist", reads=_debian_or_dir),
    Source("digits", _digits, "scikit-learn's digits (1797 images, 16x16; bundled, for tests)", channels=1, classes=10,
           corruptible=True, reads=_sklearn_digits),
    Source("digits-c", _digits, "digits with generated corruption domains", channels=1, classes=10,
           domains=tuple(corr.DEFAULT_DOMAINS), corruptible=True, images_of="digits", reads=_sklearn_digits),
    Source("cifar10", _cifar10, "CIFAR-10 (60000 images, 32x32)", **CIFAR, corruptible=True),
    Source("cifar10-c", _cifar10_c, "CIFAR-10-C: the official <type>.npy files, one domain per type", **CIFAR,
           corruption_files=tuple(datasets.CIFAR10C_TYPES)),
    Source("image-folder", _image_folder, "ROOT/<domain>/<class>/<image>: Office-Caltech-10, DomainNet, your images",
           channels=3, options=("image_size",), resized_before=64),
    Source("speechcommands", _speech_commands, "the official Speech Commands V2 folder, 12 classes, one client per "
           "speaker", channels=1, classes=12, speakers=True),
    Source("speech-synth", _speech_synth, "the same task spoken by synthetic espeak-ng speakers, generated here (not "
           "the real dataset)", channels=1, classes=12, speakers=True, reads=_espeak),
)
