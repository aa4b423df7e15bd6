"""Accuracy per kind of client: the paired Δs against the kind's best fixed FT and ft-tuned, and the line that names a
kind a learned row leaves behind while its pool mean rises."""

from __future__ import annotations

import numpy as np
import pytest

from fedl2p_cli.analysis import per_kind
from fedl2p_cli.analysis.personalized import behind_lines, kind_tables, markdown

METHODS = ["ft-bnc", "ft-bng", "ft-tuned", "fedl2p-x"]
ROLES = per_kind.Roles(("ft-bnc", "ft-bng"), "ft-tuned", ("fedl2p-x",))


def _acc() -> tuple[np.ndarray, np.ndarray]:
    """2 seeds, 4 clients: clients 0-1 are kind "clean", 2-3 "shifted". The learned row gains 10 points on the
    shifted kind and loses 3 against ft-tuned on the clean kind: its pool mean is above ft-tuned's."""
    domain = np.array([0, 0, 1, 1])
    acc = np.zeros((4, 2, 4))
    acc[0] = [[0.90, 0.92, 0.40, 0.42], [0.91, 0.93, 0.41, 0.43]]  # ft-bnc: the clean kind's best fixed FT
    acc[1] = [[0.80, 0.80, 0.60, 0.62], [0.80, 0.80, 0.61, 0.63]]  # ft-bng: the shifted kind's
    acc[2] = [[0.95, 0.95, 0.60, 0.60], [0.95, 0.95, 0.60, 0.60]]  # ft-tuned
    acc[3] = [[0.92, 0.92, 0.70, 0.70], [0.92, 0.92, 0.70, 0.70]]  # learned
    return acc, domain


def test_a_kind_below_ft_tuned_is_named_though_the_pool_mean_rose():
    acc, domain = _acc()
    pk = per_kind.table(METHODS, acc, domain, ["clean", "shifted"], ROLES)
    assert pk["kinds"] == ["clean", "shifted"]
    assert pk["best_fixed"] == {"clean": "ft-bnc", "shifted": "ft-bng"}
    clean, shifted = pk["rows"]["fedl2p-x"]["clean"], pk["rows"]["fedl2p-x"]["shifted"]
    assert clean["mean"] == pytest.approx(0.92)
    assert clean["vs_ft_tuned"]["mean"] == pytest.approx(-0.03)
    assert clean["vs_best_fixed"]["mean"] == pytest.approx(0.92 - 0.915)
    assert clean["vs_best_fixed"]["sd"] == pytest.approx(0.005)  # paired per seed: seed 0 +0.01, seed 1 0.00
    assert shifted["vs_ft_tuned"]["mean"] == pytest.approx(0.10)
    assert np.mean(acc[3]) > np.mean(acc[2])  # the pool hides it
    assert pk["left_behind"] == {"fedl2p-x": ["clean"]}
    line = behind_lines(pk, _Catalog())
    assert len(line) == 1 and "clean" in line[0] and "shifted" not in line[0] and "-3.00 ± 0.00 vs FT tuned" in line[0]


def test_below_the_kinds_best_fixed_ft_is_named_even_when_level_with_ft_tuned():
    acc, domain = _acc()
    acc[3, :, 2:] = acc[1, :, 2:] - 0.01  # the shifted kind one point below FT BN G, 1.5 above ft-tuned
    pk = per_kind.table(METHODS, acc, domain, ["clean", "shifted"], ROLES)
    assert pk["left_behind"]["fedl2p-x"] == ["clean", "shifted"]


def test_one_kind_gives_no_table():
    acc, _ = _acc()
    assert per_kind.table(METHODS, acc, np.zeros(4, dtype=int), ["clean"], ROLES) == {}


def test_summary_md_shows_the_kinds():
    acc, domain = _acc()
    pk = per_kind.table(METHODS, acc, domain, {0: "clean", 1: "shifted"}, ROLES)
    tables = kind_tables(pk, _Catalog())
    assert [t[1] for t in tables] == [["method", "clean", "shifted"]] * 2
    acc_rows = {r[0]: r[1:] for r in tables[0][2]}
    assert acc_rows["fedl2p-x"] == ["92.00 ± 0.00", "70.00 ± 0.00"]
    delta_rows = {r[0]: r[1:] for r in tables[1][2]}
    assert delta_rows["fedl2p-x vs FT tuned"] == ["-3.00 ± 0.00", "+10.00 ± 0.00"]
    s = {"pool": "seen", "clients": 4, "seeds": [0, 1], "global_acc": 0.5, "per_kind": pk,
         "methods": {m: {"mean": float(acc[i].mean()), "sd": 0.0, "sparsity": None, "per_domain": {}}
                     for i, m in enumerate(METHODS)}}
    md = markdown(s, _Catalog())
    assert "Accuracy (%) per kind of client" in md and "leaves kinds behind: clean" in md


class _Catalog:
    """No registered methods: every row is labelled by its own name."""

    def find(self, kind, name):
        return None

    def values(self, kind):
        return []
