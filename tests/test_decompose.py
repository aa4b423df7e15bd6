"""`fedl2p analyze decompose`: the learned strategy re-run on the personalisation's clients, seeds and batches must
give exactly its stored accuracy, and the learned strategy with beta fixed at 1 and the base LR is FT (BN C)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from fedl2p_cli.artifacts import Store
from fedl2p_cli.configs import DecomposeConfig
from fedl2p_cli.errors import FedL2PError
from fedl2p_cli.stages import decompose, partition, personalize

from .helpers import execute


def copied(tiny_store, tmp_path) -> tuple[Store, str]:
    """A private copy of the session's store (decompose writes to it) and its personalisation's id."""
    shutil.copytree(tiny_store["store"].root, tmp_path / "s")
    return Store(tmp_path / "s"), tiny_store["personalize"].id


def test_decompose_reproduces_the_stored_rows(tiny_store, tmp_path):
    store, pers = copied(tiny_store, tmp_path)
    art, _ = execute(decompose, DecomposeConfig(beta=1.0, eta_scales=[0.5]), store, {"personalize": pers})
    s = json.loads(art.file("summary.json").read_text())
    _, r = personalize.load(store, pers)
    rows = s["combinations"]
    stored = 100 * r.acc_after[r.methods.index("fedl2p")].mean(axis=1)
    bnc = 100 * r.acc_after[r.methods.index("ft-bnc")].mean(axis=1)
    assert rows["learned beta, learned eta"]["mean"] == pytest.approx(stored.mean(), abs=1e-9)
    assert rows["beta 1, base LR"]["mean"] == pytest.approx(bnc.mean(), abs=1e-9)  # the same strategy as FT (BN C)
    assert rows["learned beta, learned eta"]["vs_learned"] == 0.0 and "learned beta, learned eta x 0.5" in rows
    assert "| FT (BN C) (stored) |" in art.file("summary.md").read_text()
    assert execute(decompose, DecomposeConfig(beta=1.0, eta_scales=[0.5]), store, {"personalize": pers})[1]  # reused
    with pytest.raises(FedL2PError, match="no learned method ft-bnc"):
        execute(decompose, DecomposeConfig(method="ft-bnc"), store, {"personalize": pers})
    assert np.isfinite(rows["beta 1, learned eta"]["mean"])


def test_layer_probe_changes_one_layer_and_rows_split_by_domain(tiny_store, tmp_path):
    beta, eta = np.array([0.2, 0.5, 0.9], np.float32), np.array([0.01, 0.02], np.float32)
    c = decompose.combos(beta, eta, 1.0, 0.01, [], [0.0, 1.0])
    for layer in range(3):
        for v in (0.0, 1.0):
            b, e = c[f"learned, BN layer {layer} beta {v:g}"]
            want = beta.copy()
            want[layer] = v
            assert np.array_equal(b, want) and np.array_equal(e, eta)
    assert np.array_equal(beta, np.array([0.2, 0.5, 0.9], np.float32))  # the learned strategy itself untouched
    store, pers = copied(tiny_store, tmp_path)
    art, _ = execute(decompose, DecomposeConfig(beta=1.0, layer_betas=[0.0]), store, {"personalize": pers})
    s = json.loads(art.file("summary.json").read_text())
    _, r = personalize.load(store, pers)
    _, part = partition.load(store, tiny_store["partition"].id)
    stored = 100 * r.acc_after[r.methods.index("fedl2p")]  # [seeds, clients]
    dom = np.array([part.domain[int(c)] for c in r.client])
    assert len(s["by_domain"]) == len(set(dom.tolist())) > 1
    for d in set(dom.tolist()):  # each domain's learned row is its own clients' stored accuracy
        row = s["by_domain"][part.domain_names[d]]["learned beta, learned eta"]
        assert row["mean"] == pytest.approx(stored[:, dom == d].mean(), abs=1e-9)
    assert {f"learned, BN layer {i} beta 0" for i in range(3)} <= set(s["combinations"])
    assert "By domain" in art.file("summary.md").read_text()
