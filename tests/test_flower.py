"""The Flower engine: the wire format (always), and `--engine flower` against the in-process engine (only where the
optional extra is installed: `make test-flower` builds a venv with it)."""

from __future__ import annotations

import importlib.util
import math
import shutil

import pytest
import torch

from fedl2p_cli.algorithms.fedl2p import ClientResult
from fedl2p_cli.artifacts import Store
from fedl2p_cli.errors import FedL2PError
from fedl2p_cli.engine import wire
from fedl2p_cli.io import weights

from .conftest import TINY_META, TINY_PRETRAIN

HAS_FLOWER = all(importlib.util.find_spec(m) is not None for m in ("flwr", "ray"))
needs_flower = pytest.mark.skipif(not HAS_FLOWER, reason="Flower extra not installed (pip install 'fedl2p[flower]'; "
                                  "`make test-flower` runs these)")


def test_wire_round_trip_is_exact():
    lam = {"bnnet.0.weight": torch.randn(3, 4), "eta": torch.tensor([1e-3, float("nan")]), "n": torch.arange(3)}
    res = ClientResult(lam, 40, 0.1 + 0.2, float("inf"), torch.rand(3), torch.rand(5), {"gnorm": 1 / 3})
    task = (7, lam, 2, [1.5, None, "x"], (True,))
    for obj in (task, (res, {"clients": 0.25}), ("client 3: diverged", {})):
        tensors, skeleton = wire.pack(obj)
        back = wire.unpack({k: v.clone() for k, v in tensors.items()}, skeleton)
        assert _same(obj, back)
    assert type(wire.unpack(*wire.pack((1, 2)))) is tuple and type(wire.unpack(*wire.pack([1, 2]))) is list


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(-1).view(torch.uint8) if a.is_floating_point()
                                                                           else a, b.view(-1).view(torch.uint8)
                                                                           if b.is_floating_point() else b)
    if isinstance(a, float):
        return isinstance(b, float) and (a == b or (math.isnan(a) and math.isnan(b)))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, ClientResult):
        return type(b) is ClientResult and all(_same(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    return a == b and type(a) is type(b)


def test_wire_refuses_code_outside_the_package_and_unknown_types():
    skeleton = '{"$dc": "subprocess:Popen", "f": {}}'
    with pytest.raises(ValueError, match="refusing"):
        wire.unpack({}, skeleton)
    with pytest.raises(TypeError, match="cannot send"):
        wire.pack({"x": object()})


def test_missing_extra_is_one_clear_line(monkeypatch):
    import sys
    from fedl2p_cli.engine import flower
    monkeypatch.setitem(sys.modules, "flwr", None)  # import flwr -> ImportError
    with pytest.raises(FedL2PError, match=r"pip install 'fedl2p\[flower\]'"):
        flower.require_flower()


def test_unknown_engine_is_refused(tiny_store):
    from fedl2p_cli.stages import meta_train
    cfg = meta_train.MetaTrainConfig(rounds=1, engine="spark", meta=TINY_META)
    with pytest.raises(FedL2PError, match="--engine"):
        meta_train.check(cfg)


@needs_flower
def test_flower_meta_train_matches_the_in_process_engine(tiny_store, tmp_path):
    """Same id; lambda and the per-round validation losses equal up to float32 rounding (the ClientApps run in Ray
    worker processes, whose float32 reductions differ from this process's by ~1 ulp: measured <= 3e-8 on lambda)."""
    from fedl2p_cli.stages import meta_train
    arts = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for engine in ("local", "flower"):
            root = tmp_path / engine
            shutil.copytree(tiny_store["store"].root, root)
            cfg = meta_train.MetaTrainConfig(rounds=2, fraction=0.5, seed=31, meta=TINY_META, engine=engine, workers=2)
            arts[engine] = meta_train.run(cfg, Store(root), tiny_store["pretrain"].id, tiny_store["stats"].id)[0]
    finally:
        torch.set_num_threads(threads)
    a, b = arts["local"], arts["flower"]
    assert a.id == b.id
    la, lb = weights.load(a.file("lambda.safetensors")), weights.load(b.file("lambda.safetensors"))
    assert la.keys() == lb.keys()
    for k in la:
        torch.testing.assert_close(la[k], lb[k], rtol=0, atol=1e-6)
    va, vb = (b_.metrics["best_val_loss"] for b_ in (a, b))
    assert abs(va - vb) < 1e-6 and a.metrics["rounds_run"] == b.metrics["rounds_run"] == 2


@needs_flower
def test_flower_pretraining_matches_the_in_process_engine(tiny_store, tmp_path):
    from fedl2p_cli.stages import pretrain
    arts = []
    for engine in ("local", "flower"):
        store = Store(tmp_path / engine)
        store.root.mkdir(parents=True)
        shutil.copytree(tiny_store["store"].root / "partition", store.root / "partition")
        cfg = pretrain.PretrainConfig(**TINY_PRETRAIN, engine=engine)
        arts.append(pretrain.run(cfg, store, tiny_store["partition"].id, plot=False)[0])
    assert arts[0].id == arts[1].id
    wa, wb = (weights.load(a.file("model.safetensors")) for a in arts)
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=1e-5)
