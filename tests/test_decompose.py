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
from fedl2p_cli.stages import decompose, personalize


def test_decompose_reproduces_the_stored_rows(tiny_store, tmp_path):
    shutil.copytree(tiny_store["store"].root, tmp_path / "s")
    store = Store(tmp_path / "s")
    pers = tiny_store["personalize"].id
    art, _ = decompose.run(DecomposeConfig(beta=1.0, eta_scales=[0.5]), store, pers)
    s = json.loads(art.file("summary.json").read_text())
    _, r = personalize.load(store, pers)
    rows = s["combinations"]
    stored = 100 * r.acc_after[r.methods.index("fedl2p")].mean(axis=1)
    bnc = 100 * r.acc_after[r.methods.index("ft-bnc")].mean(axis=1)
    assert rows["learned beta, learned eta"]["mean"] == pytest.approx(stored.mean(), abs=1e-9)
    assert rows["beta 1, base LR"]["mean"] == pytest.approx(bnc.mean(), abs=1e-9)  # the same strategy as FT (BN C)
    assert rows["learned beta, learned eta"]["vs_learned"] == 0.0 and "learned beta, learned eta x 0.5" in rows
    assert "| FT (BN C) (stored) |" in art.file("summary.md").read_text()
    assert decompose.run(DecomposeConfig(beta=1.0, eta_scales=[0.5]), store, pers)[1]  # reused
    with pytest.raises(FedL2PError, match="no learned method ft-bnc"):
        decompose.run(DecomposeConfig(method="ft-bnc"), store, pers)
    assert np.isfinite(rows["beta 1, learned eta"]["mean"])
