"""Are a learned row's strategies personal? (fedl2p_cli/analysis/spread.py): the spread of β and LRs across clients
and domains, and the one line that says every client got the same strategy."""

from __future__ import annotations

import numpy as np

from fedl2p_cli.analysis import spread


def test_a_split_by_domain_is_measured_and_not_called_the_same():
    domain = np.array([0, 0, 1, 1])
    beta = np.array([[1.0, 0.2], [1.0, 0.3], [1.0, 0.9], [1.0, 0.8]])
    eta = np.array([[1e-3, 1e-3], [1e-3, 1e-3], [1e-2, 1e-3], [1e-2, 1e-3]])
    s = spread.spread(beta, eta, domain)
    assert np.isclose(s["beta_split_domains"], 0.6) and np.isclose(s["eta_ratio_domains"], 10.0)
    assert np.isclose(s["beta_sd_clients"], np.std([0.2, 0.3, 0.9, 0.8]))
    assert not spread.same_for_everyone(s) and spread.verdict("x", s) is None


def test_one_strategy_for_everyone_gets_its_line():
    domain = np.array([0, 0, 1, 1])
    beta = np.full((4, 3), 0.9) + np.array([[0.0], [0.001], [0.002], [0.0]])
    eta = np.full((4, 5), 1e-3)
    eta[:, 0] = 0.0  # a frozen tensor has no ratio
    s = spread.spread(beta, eta, domain)
    assert spread.same_for_everyone(s)
    line = spread.verdict("FedL2P", s)
    assert line is not None and "every client got nearly the same strategy" in line and spread.PERSONAL_OPTIONS in line
    lines = spread.lines("FedL2P", s)
    assert len(lines) == 2 and lines[1] == line
    # only the LRs differ by client: personal, no line
    eta2 = eta.copy()
    eta2[2:, 1] = 2e-3
    assert spread.verdict("FedL2P", spread.spread(beta, eta2, domain)) is None


def test_clients_without_a_strategy_are_left_out():
    domain = np.array([0, 1, 1])
    beta = np.array([[0.0], [1.0], [np.nan]])
    eta = np.array([[1e-3], [1e-3], [np.nan]])
    s = spread.spread(beta, eta, domain)
    assert s["beta_split_domains"] == 1.0
    assert spread.spread(beta[2:], eta[2:], domain[2:]) == {}


def test_a_split_by_kind_is_rare_under_shuffled_labels_and_one_of_the_inputs_geometry_is_not():
    """The permutation p of the β split: kinds whose β differ (one layer, 0.3 apart, small noise) give p = 1/1000;
    the same clients with the kind labels drawn at random (the split there is any grouping's) give a large p."""
    from fedl2p_cli.analysis.spread import PERMUTATIONS, permutation_p
    rng = np.random.default_rng(1)
    domain = np.repeat([0, 1], 12)
    beta = np.column_stack([0.5 + 0.3 * domain + 0.01 * rng.standard_normal(24), 0.5 + 0.01 * rng.standard_normal(24)])
    s = spread.spread(beta, np.ones((24, 3)), domain)
    assert s["beta_split_p"] == 1 / (1 + PERMUTATIONS) and "permutation p 0.001" in spread.lines("x", s)[0]
    shuffled = rng.permutation(domain)
    split = float(np.ptp([beta[shuffled == d].mean(0) for d in (0, 1)], axis=0).max())
    assert permutation_p(beta, shuffled, split) > 0.05
    assert permutation_p(beta, shuffled, split) == permutation_p(beta, shuffled, split)  # seeded


def test_one_client_per_kind_gets_no_permutation_p():
    """Every shuffle of 7 labels over 7 clients gives the same set of kind means: no p is printed (it would be 1)."""
    beta = np.linspace(0.1, 0.9, 7)[:, None]
    s = spread.spread(beta, np.ones((7, 2)), np.arange(7))
    assert "beta_split_p" not in s and s["beta_split_domains"] > 0.7
