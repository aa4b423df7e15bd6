"""The numbers a user reads, recomputed independently from the artifacts (issue 51): the global model's row is its
accuracy on each client's *test* split (a one-line change to the validation split survived the whole suite), each
method's row is the mean over clients then mean and population SD over the seeds, "Δ vs best FT" is against the
best hand-made baseline on the same clients and seeds, and a difference that rounds to zero reads "0.00"."""

from __future__ import annotations

import json

import h5py
import numpy as np
import torch

from fedl2p_cli import methods, plugins
from fedl2p_cli.io import results_h5
from fedl2p_cli.stages import personalize, pretrain


def test_the_global_model_row_is_the_pretrained_model_on_each_clients_test_split(tiny_store):
    store, pers = tiny_store["store"], tiny_store["personalize"]
    r = results_h5.read(pers.file("results.h5"))
    _, model, _ = pretrain.load(store, tiny_store["pretrain"].id, plugins.current())
    with h5py.File(tiny_store["partition"].file("partition.h5"), "r") as f:
        images, labels, offsets = f["images"][...], f["labels"][...], f["offsets"][...]
        mean = torch.tensor(json.loads(f.attrs["mean"])).view(1, -1, 1, 1)
        std = torch.tensor(json.loads(f.attrs["std"])).view(1, -1, 1, 1)
    model.eval()
    want = []
    for c in r.client:
        lo, hi = offsets[c, 2], offsets[c, 3]  # [o2, o3): the client's test split
        x = (torch.from_numpy(images[lo:hi]).float() / 255 - mean) / std
        with torch.no_grad():
            pred = model(x).argmax(1).numpy()
        want.append(float((pred == labels[lo:hi]).mean()))
    np.testing.assert_allclose(r.acc_before, want, rtol=0, atol=1e-12)
    summary = json.loads(pers.file("summary.json").read_text())
    assert summary["global_acc"] == float(np.mean(want))


def test_each_row_and_its_delta_recomputed_from_the_results(tiny_store):
    pers = tiny_store["personalize"]
    r = results_h5.read(pers.file("results.h5"))
    s = json.loads(pers.file("summary.json").read_text())
    per_seed = {m: r.acc_after[i].mean(axis=1) for i, m in enumerate(r.methods)}  # mean over clients, per seed
    for m, v in s["methods"].items():
        assert (v["mean"], v["sd"]) == (float(np.mean(per_seed[m])), float(np.std(per_seed[m])))
    base = [m for m in r.methods if m in methods.baselines(plugins.current())]
    best = max(base, key=lambda m: np.mean(per_seed[m]))
    assert s["best_baseline"] == best
    for i, m in enumerate(r.methods):
        if m not in base:
            diff = (r.acc_after[i] - r.acc_after[r.methods.index(best)]).mean(axis=0)
            assert s["methods"][m]["vs_best_baseline"] == float(np.mean(diff))


def test_a_difference_that_rounds_to_zero_reads_0_00():
    row = personalize.row_cells("fedl2p", {"mean": 0.5, "sd": 0.0, "vs_best_baseline": -1e-5, "vs_ft_tuned": 0.0,
                                           "clients_better": 0.0}, plugins.current())
    assert row[2:4] == ["0.00", "0.00"]


def test_clients_better_counts_a_tie_as_not_better():
    """Mutation pin (stages/personalize.py deltas): the "clients better" column counts clients strictly above the best
    FT; a client level with it is not better."""
    best = np.array([[0.5, 0.6, 0.7, 0.8], [0.5, 0.6, 0.7, 0.8]])
    acc = np.array([[0.6, 0.6, 0.6, np.nan], [0.6, 0.6, 0.6, 0.9]])  # better, tied, worse, better in one seed only
    d = personalize.deltas(acc, best, None)
    assert d["clients_better"] == 2 / 4
    assert personalize.deltas(best.copy(), best, None)["clients_better"] == 0.0
