"""The example plugin's pieces on their own (examples/fedl2p-fedbn): FedBN's client update and aggregation, a new
client's start, the .npz dataset and the torchvision model. The package's end-to-end run through the CLI is
tests/test_fedbn_plugin.py."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "fedl2p-fedbn"))

from fedl2p_fedbn import fedbn  # noqa: E402
from fedl2p_fedbn.model import HardSigmoid, HardSwish, mobilenet_v3_small  # noqa: E402
from fedl2p_fedbn.npz import load_npz  # noqa: E402

from fedl2p_cli import plugins
from fedl2p_cli.algorithms.local import LocalConfig  # noqa: E402
from fedl2p_cli.core.functional import get_state  # noqa: E402
from fedl2p_cli.engine.loop import generator  # noqa: E402
from fedl2p_cli.errors import DataError  # noqa: E402
from fedl2p_cli.models import registry  # noqa: E402


def clients(n: int, sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Clients whose images differ in scale and offset (feature shift: their BN statistics differ)."""
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(s, 1, 8, 8, generator=g) * (1 + i) + i, torch.randint(0, 3, (s,), generator=g))
            for i, s in enumerate(sizes[:n])]


def test_local_keys_are_the_bn_layers_and_nothing_else():
    model = registry.build("small-cnn", 1, 3, catalog=plugins.current())
    keys = fedbn.local_keys(model)
    bn = {n for n, m in model.named_modules() if m.__class__.__name__ == "MixBN"}
    assert keys == {f"{b}.{k}" for b in bn for k in ("weight", "bias", "running_mean", "running_var")}
    tv = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.LazyLinear(3))
    assert fedbn.local_keys(tv) == {"1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked"}
    with pytest.raises(ValueError, match="BatchNorm layers; this one has none"):
        fedbn.local_keys(nn.Sequential(nn.Flatten(), nn.Linear(4, 2)))


def test_a_round_keeps_bn_local_and_averages_the_rest_by_sample_count():
    model = registry.build("small-cnn", 1, 3, catalog=plugins.current())
    keys = fedbn.local_keys(model)
    shared, init_local = fedbn.split(get_state(model), keys)
    cfg = LocalConfig(epochs=1, batch_size=8)
    data = clients(3, [16, 32, 48])
    results = []
    for c, (x, y) in enumerate(data):
        state, _ = fedbn.client_update(model, shared, init_local, x, y, 0.1, cfg, generator(0, 0, c))
        results.append((state, len(y)))
    new_shared, locals_ = fedbn.aggregate(results, keys)
    assert set(new_shared) == set(shared) and all(set(loc) == keys for loc in locals_)
    for k in new_shared:  # every shared tensor is the sample-weighted mean of the clients' updates
        want = sum(s[k].double() * n for s, n in results) / sum(n for _, n in results)
        torch.testing.assert_close(new_shared[k].double(), want, rtol=0, atol=1e-6)
        assert not torch.equal(new_shared[k], results[0][0][k])  # not one client's
    for loc, (s, _) in zip(locals_, results):  # each client gets back its own BN layers, untouched
        assert all(torch.equal(loc[k], s[k]) for k in keys)
    for k in keys:  # and they differ between clients (their data differ)
        if k.endswith(("running_mean", "running_var", "weight")):
            assert not torch.allclose(locals_[0][k], locals_[2][k]), k


def test_a_new_client_trains_only_its_bn_and_takes_its_own_statistics():
    model = registry.build("small-cnn", 1, 3, catalog=plugins.current())
    keys = fedbn.local_keys(model)
    shared, local = fedbn.split(get_state(model), keys)
    x, y = clients(3, [40, 40, 40])[2]
    new_local, loss = fedbn.adapt_bn(model, shared, local, x, y, 0.1, LocalConfig(epochs=2, batch_size=8),
                                     generator(0, 1))
    assert set(new_local) == keys and np.isfinite(loss)
    assert all(torch.equal(v, shared[k]) for k, v in fedbn.split(get_state(model), keys)[0].items())  # shared kept
    first = next(n for n in sorted(keys) if n.endswith("weight"))
    assert not torch.equal(new_local[first], local[first])  # the BN affine parameters trained
    bn0 = first.rsplit(".", 1)[0]
    conv = model[0](x)  # the first BN layer's input: its statistics are the client's own, exactly (one chunk)
    torch.testing.assert_close(new_local[f"{bn0}.running_mean"], conv.mean((0, 2, 3)))
    torch.testing.assert_close(new_local[f"{bn0}.running_var"], conv.var((0, 2, 3)), rtol=1e-4, atol=1e-5)


def test_the_mean_local_start_is_weighted_by_sample_count():
    a, b = {"w": torch.zeros(2)}, {"w": torch.ones(2)}
    torch.testing.assert_close(fedbn.mean_local([a, b], [1, 3])["w"], torch.full((2,), 0.75))


def test_npz_layouts_domains_and_errors(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (12, 10, 10, 3), dtype=np.uint8)
    y = np.arange(12) % 4
    np.savez(tmp_path / "a.npz", x=x, y=y, domain=np.array(["photo", "sketch"] * 6))
    ds = load_npz(tmp_path / "a.npz")
    assert ds.images.shape == (12, 3, 10, 10) and torch.equal(ds.images, torch.from_numpy(x.transpose(0, 3, 1, 2)))
    assert ds.domain_names == ["photo", "sketch"] and ds.domains.tolist() == [0, 1] * 6 and ds.classes == list("0123")
    np.savez(tmp_path / "b.npz", x=rng.random((5, 6, 6)), y=np.zeros(5, dtype=np.int64))
    b = load_npz(tmp_path / "b.npz")
    assert b.images.shape == (5, 1, 6, 6) and b.images.dtype == torch.uint8 and b.domains is None
    bad = {"c.npz": dict(x=x), "d.npz": dict(x=x, y=y[:3]), "e.npz": dict(x=x.astype(np.float32), y=y),
           "f.npz": dict(x=x, y=y, domain=np.zeros(3))}
    for name, arrays in bad.items():
        np.savez(tmp_path / name, **arrays)
        with pytest.raises(DataError, match=name):
            load_npz(tmp_path / name)
    with pytest.raises(DataError, match="--data-dir"):
        load_npz(tmp_path / "missing.npz")


def test_mobilenet_takes_any_channel_count_and_differentiates_twice():
    torch.manual_seed(0)
    m = mobilenet_v3_small(1, 5).eval()
    x = torch.randn(2, 1, 16, 16)
    assert m(x).shape == (2, 5)
    assert sum(isinstance(b, nn.BatchNorm2d) for b in m.modules()) == 34  # torchvision's own BN, swapped by fedl2p
    assert not any(isinstance(a, (nn.Hardsigmoid, nn.Hardswish)) for a in m.modules())
    z = torch.linspace(-5, 5, 101)
    torch.testing.assert_close(HardSwish()(z), nn.functional.hardswish(z))  # the same functions
    torch.testing.assert_close(HardSigmoid()(z), nn.functional.hardsigmoid(z))
    p = list(m.parameters())
    g = torch.autograd.grad(m(x).square().sum(), p, create_graph=True)  # what FedL2P's meta-gradient needs
    torch.autograd.grad(sum(v.square().sum() for v in g), p[0])
