"""A user's own data (issue 51): the content of the data a partition read is part of its id (changed data: a new id;
the same data at another path: the same id; the built-in Debian Fashion-MNIST and the bundled digits keep the ids
they had), and every dataset a source returns is checked where it enters, each fault one line naming the dataset, the
plugin and the field, exit 2, nothing written."""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from fedl2p_cli import plugins
from fedl2p_cli.artifacts import Store
from fedl2p_cli.cli.main import run_cli
from fedl2p_cli.configs import PartitionConfig
from fedl2p_cli.data import datasets, sources
from fedl2p_cli.data.sources import Source
from fedl2p_cli.errors import FedL2PError
from fedl2p_cli.stages import partition

from .helpers import execute

PLUGIN = plugins.Plugin("tp_data", "fedl2p-tp-data", "0.1")
WHO = "dataset 'tp-data' from plugin 'tp_data' (fedl2p-tp-data 0.1)"
CFG = dict(dataset="tp-data", clients=4, samples_per_client=10, alpha=1000.0, seed=0)


def good(n: int = 120) -> datasets.Dataset:
    g = torch.Generator().manual_seed(0)
    return datasets.Dataset("tp-data", torch.randint(0, 256, (n, 1, 8, 8), dtype=torch.uint8, generator=g),
                            torch.arange(n) % 3, ["a", "b", "c"], (0.5,), (0.25,))


def npz_load(cfg, data_dir):
    """A plugin's loader: the arrays of the .npz file --data-dir names."""
    with np.load(data_dir) as z:
        return datasets.Dataset("tp-data", torch.from_numpy(z["x"]), torch.from_numpy(z["y"]), ["a", "b", "c"], (0.5,),
                                (0.25,))


@pytest.fixture
def register():
    """Register `tp-data` (a loader) as plugin tp_data's, in a catalog of this test's own."""
    with contextlib.ExitStack() as stack:
        def add(load, **kw):
            catalog = plugins.build()
            catalog.add(PLUGIN, [("dataset", "tp-data", Source("tp-data", load, "test data", **kw))])
            stack.enter_context(plugins.using(catalog))
        yield add


def with_(**fields):
    return lambda cfg, d: replace(good(), **fields)


def _float01(cfg, d):
    ds = good()
    return replace(ds, images=ds.images.float() / 255)


# every fault a dataset can have, and the one line each gives (docs: the table in the issue-51 note)
BAD = {
    "labels shorter than images": (with_(labels=torch.arange(119) % 3),
                                   "labels number 119, images 120; there must be one per image"),
    "no channel axis": (with_(images=good().images[:, 0]),
                        "images has shape (120, 8, 8); it must be (N, C, H, W) (a single channel: images[:, None])"),
    "five axes": (with_(images=good().images[:, None]), "images has shape (120, 1, 1, 8, 8); it must be (N, C, H, W)"),
    "empty axis": (with_(images=good().images[:, :, :0]), "images has shape (120, 1, 0, 8); no axis may be empty"),
    "a numpy array": (with_(images=good().images.numpy()),
                      "images is a ndarray; give a torch.Tensor (torch.from_numpy(array))"),
    "int64 images": (with_(images=good().images.long()), "images are int64; give uint8 (0..255) or float in [0, 1]"),
    "float images 0..255": (with_(images=good().images.float()),
                            "images are float32 in [0, 255]; float images must be in [0, 1] (0..255 values: "
                            "images.to(torch.uint8))"),
    "standardised float images": (with_(images=good().images.float() / 255 - 0.5),
                                  "images are float32 in [-0.5, 0.5]; float images must be in [0, 1]"),
    "NaN in images": (with_(images=torch.full((120, 1, 8, 8), float("nan"))), "images hold NaN or infinite values"),
    "label = number of classes": (with_(labels=torch.arange(120) % 4),
                                  "labels hold 3, but there are 3 classes (labels run from 0 to 2)"),
    "negative label": (with_(labels=torch.arange(120) % 3 - 1), "labels hold -1; they must be >= 0"),
    "float labels": (with_(labels=(torch.arange(120) % 3).float()), "labels are float32; give integers (torch.int64)"),
    "labels (N, 1)": (with_(labels=(torch.arange(120) % 3)[:, None]),
                      "labels has shape (120, 1); it must be one value per image, (120,)"),
    "no classes": (with_(classes=[]), "classes is []; give a non-empty list of names (str)"),
    "a class twice": (with_(classes=["a", "b", "a"]), "classes name one twice"),
    "mean in 0..255 units": (with_(mean=(72.9,)), "mean holds 72.9; it is in the units of images scaled to [0, 1] "
                             "(pixel / 255), so in [0, 1]"),
    "std 0": (with_(std=(0.0,)), "std holds 0; it is in the units of images scaled to [0, 1] (pixel / 255), so in (0, 1]"),
    "mean per RGB channel for grey images": (with_(mean=(0.5, 0.5, 0.5)), "mean has 3 values for 1 channels"),
    "domain array too short": (with_(domains=torch.zeros(100, dtype=torch.int64), domain_names=["x"]),
                               "domains number 100, images 120; there must be one per image"),
    "domain id without a name": (with_(domains=torch.arange(120) % 3, domain_names=["x", "y"]),
                                 "domains hold 2, but there are 2 domain_names (ids run from 0 to 1)"),
    "domains without names": (with_(domains=torch.zeros(120, dtype=torch.int64)),
                              "domain_names is None; give a non-empty list of names (str)"),
    "fewer images than clients": (lambda cfg, d: good(3),
                                  "images number 3; --clients 4 needs at least one sample for each client"),
    "not a Dataset": (lambda cfg, d: (good().images, good().labels),
                      "load() returned tuple, not a fedl2p_cli.data.datasets.Dataset"),
    "a loader that raises": (lambda cfg, d: np.load("/nonexistent/x.npz"),
                             "its load() raised FileNotFoundError: [Errno 2] No such file or directory: "
                             "'/nonexistent/x.npz'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_dataset_is_one_line_naming_dataset_plugin_and_field_and_writes_nothing(case, register, tmp_path, capsys,
                                                                                       monkeypatch):
    load, line = BAD[case]
    register(load)
    root = tmp_path / "store"
    monkeypatch.setenv("FEDL2P_STORE", str(root))
    capsys.readouterr()
    code = run_cli(["partition", "--dataset", "tp-data", "--clients", "4", "--samples-per-client", "10", "--alpha",
                    "1000"])
    err = capsys.readouterr().err
    assert (code, err) == (2, f"error: {WHO}: {line}\n")
    assert not root.exists()


def test_float_images_in_0_1_are_stored_as_uint8(register, tmp_path):
    """Float images in [0, 1] are the same partition as their uint8 pixels (round(255 x)), stored as uint8."""
    register(_float01)
    a_art, _ = execute(partition, PartitionConfig(**CFG), Store(tmp_path / "a"), plot=False)
    register(lambda cfg, d: good())
    b_art, _ = execute(partition, PartitionConfig(**CFG), Store(tmp_path / "b"), plot=False)
    assert a_art.id == b_art.id
    p = partition.load(Store(tmp_path / "a"), a_art.id)[1]
    assert p.images.dtype == torch.uint8 and p.mean == (0.5,)


def _npz(path: Path, ds: datasets.Dataset) -> Path:
    np.savez(path, x=ds.images.numpy(), y=ds.labels.numpy())
    return path


def _first(register, tmp_path) -> tuple:
    """A counting npz source, a store, a data file and the partition of it (each `load` call is recorded)."""
    calls: list = []
    register(lambda cfg, d: calls.append(d) or npz_load(cfg, d))
    store = Store(tmp_path / "store")
    a = _npz(tmp_path / "a.npz", good())
    first, reused = execute(partition, PartitionConfig(**CFG, data_dir=str(a)), store, plot=False)
    return calls, store, a, first, reused


def test_changed_data_is_a_new_partition_and_the_same_data_elsewhere_the_same(register, tmp_path):
    """The trial's case: another file under the same options was `reused partition artifact` of the first one."""
    _, store, a, first, reused = _first(register, tmp_path)
    assert not reused and first.manifest["data"]["fingerprint"] == first.config["data"]
    other = tmp_path / "elsewhere"
    other.mkdir()
    shutil.copy(a, other / "copy.npz")
    again, reused = execute(partition, PartitionConfig(**CFG, data_dir=str(other / "copy.npz")), store, plot=False)
    assert (again.id, reused) == (first.id, True)
    broken = good()
    broken.labels = broken.labels.flip(0)
    _npz(tmp_path / "b.npz", broken)
    changed, reused = execute(partition, PartitionConfig(**CFG, data_dir=str(tmp_path / "b.npz")), store, plot=False)
    assert changed.id != first.id and not reused


def test_a_rerun_reads_the_fingerprint_from_the_cache_until_a_file_changes(register, tmp_path):
    calls, store, a, first, _ = _first(register, tmp_path)
    again, reused = execute(partition, PartitionConfig(**CFG, data_dir=str(a)), store, plot=False)
    assert (again.id, reused, len(calls)) == (first.id, True, 1)  # the re-run loaded nothing
    shifted = good()
    shifted.images = 255 - shifted.images
    _npz(a, shifted)  # the same path, new content (and size or mtime)
    changed, reused = execute(partition, PartitionConfig(**CFG, data_dir=str(a)), store, plot=False)
    assert changed.id != first.id and not reused and len(calls) == 2


def test_the_builtin_data_keeps_its_ids_and_the_manifest_names_its_fingerprint(tiny_store, capsys, monkeypatch):
    """tests/test_any_model.py pins the tiny store's ids; here: the fingerprint is the bundled digits' constant, left
    out of the id, recorded in the manifest and printed by `artifacts show`."""
    art = tiny_store["partition"]
    assert art.id == "6e46b63b4df2" and "data" not in art.config
    assert art.manifest["data"] == {"fingerprint": "sha256:1e5dd70d9eec6d614153395ad87a843d74c2f8e8744523e1f7d1fea44d70fb6a",
                                    "known": "scikit-learn's bundled digits"}
    monkeypatch.setenv("FEDL2P_STORE", str(tiny_store["store"].root))
    capsys.readouterr()
    assert run_cli(["artifacts", "show", "partition", art.id]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["fingerprint"] == art.manifest["data"]["fingerprint"]


@pytest.mark.skipif(not datasets.DEBIAN_FMNIST.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_debian_fashion_mnist_is_the_pinned_fingerprint():
    from fedl2p_cli.data import fingerprint
    ds = sources.load(PartitionConfig(dataset="fmnist"), None, plugins.build())
    assert fingerprint.known(fingerprint.of(ds)) == "Debian's dataset-fashion-mnist"


def test_partition_refuses_before_the_store_exists(register, tmp_path):
    register(with_(labels=torch.arange(119) % 3))
    with pytest.raises(FedL2PError, match="labels number 119"):
        execute(partition, PartitionConfig(**CFG), Store(tmp_path / "store"), plot=False)
    assert not (tmp_path / "store").exists()
