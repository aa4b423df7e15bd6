"""`fedl2p analyze beta-grid`: what each way of choosing beta scores, recomputed here from the stored scores and, for
one client, from a fine-tune written out in the test."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from fedl2p_cli import plugins
from fedl2p_cli.artifacts import Store
from fedl2p_cli.configs import BetaGridConfig
from fedl2p_cli.core.config import ConfigError
from fedl2p_cli.core.finetune import Strategy, finetune, personalized_accuracy
from fedl2p_cli.engine.loop import generator
from fedl2p_cli.errors import FedL2PError
from fedl2p_cli.stages import beta_grid, partition, pretrain, stats

from .helpers import execute


@pytest.fixture(scope="module")
def grid_run(tiny_store, tmp_path_factory):
    root = tmp_path_factory.mktemp("bg") / "s"
    shutil.copytree(tiny_store["store"].root, root)
    store = Store(root)
    cfg = BetaGridConfig(lr=0.01, levels=[0.0, 1.0], seeds=[0, 1], epochs=1, batch_size=16)
    art, reused = execute(beta_grid, cfg, store, {"stats": tiny_store["stats"].id})
    return store, cfg, art, reused


def test_the_choices_are_what_the_scores_say(grid_run):
    store, cfg, art, reused = grid_run
    assert not reused and execute(beta_grid, cfg, store, {"stats": art.parents["stats"]})[1]  # the second run reuses it
    raw = json.loads(art.file("scores.json").read_text())
    sc, dom = np.array(raw["scores"]), np.array(raw["domain"])
    assert sc.shape == (2, len(raw["clients"]), 8, 2) and len(raw["grid"]) == 8  # 2 levels ^ 3 BN layers
    s = json.loads(art.file("summary.json").read_text())
    for k in range(2):  # independent of analysis.beta_grid: argmax of mean validation accuracy, scored on test
        shared = int(np.argmax(sc[k, :, :, 0].mean(0)))
        want_shared = sc[k, :, shared, 1].mean()
        per = np.empty(len(dom))
        for d in set(dom):
            m = dom == d
            per[m] = sc[k, m, int(np.argmax(sc[k, m, :, 0].mean(0))), 1]
        assert s["choices"]["shared"]["val"][k] == pytest.approx(want_shared)
        assert s["choices"]["per domain"]["val"][k] == pytest.approx(per.mean())
        assert s["choices"]["per domain"]["gain"][k] == pytest.approx(per.mean() - want_shared)
        best_shared = max(sc[k, :, i, 1].mean() for i in range(8))  # the bound: chosen on test
        assert s["choices"]["shared"]["bound"][k] == pytest.approx(best_shared)
        assert s["choices"]["per client"]["bound"][k] >= s["choices"]["per domain"]["bound"][k] >= best_shared - 1e-9
    assert art.metrics["per_domain_gain"] == pytest.approx(np.mean(s["choices"]["per domain"]["gain"]))
    assert "| per domain |" in art.file("summary.md").read_text()


def test_a_score_is_the_fine_tune_it_names(grid_run, tiny_store):
    store, cfg, art, _ = grid_run
    raw = json.loads(art.file("scores.json").read_text())
    _, part = partition.load(store, art.parents["partition"])
    _, model, state = pretrain.load(store, art.parents["pretrain"], plugins.current())
    _, table = stats.load(store, art.parents["stats"])
    theta = {n: state[n] for n, _ in model.named_parameters()}
    c, i, seed = raw["clients"][2], 5, 1
    s = Strategy(torch.tensor(raw["grid"][i], dtype=torch.float32), torch.full((len(theta),), 0.01))
    data = part.client(c)
    ft = finetune(model.eval(), theta, *data.train, s, table.client_bn(c), 1, 16, generator(seed, c, 7))
    want = [100 * personalized_accuracy(model, ft.params, *split, s, ft.bn, 16)[1] for split in (data.val, data.test)]
    assert raw["scores"][1][2][i] == pytest.approx(want, abs=1e-3)


def test_bad_input(tiny_store):
    store = tiny_store["store"]
    with pytest.raises(ConfigError, match="--levels must be in \\[0, 1\\]"):
        execute(beta_grid, BetaGridConfig(levels=[0.0, 1.5]), store)
    with pytest.raises(FedL2PError, match="beta vectors"):
        execute(beta_grid, BetaGridConfig(levels=[i / 20 for i in range(21)]), store, {"stats": tiny_store["stats"].id})


def test_choices_on_hand_made_scores():
    """Two domains of two clients, three vectors: validation prefers vector 0 for domain a and 2 for domain b, test
    disagrees in places, so every choice and bound has one right answer."""
    from fedl2p_cli.analysis.beta_grid import summarize
    val = np.array([[90, 10, 50], [80, 20, 60], [10, 40, 70], [20, 30, 90]], dtype=float)
    test = np.array([[70, 95, 50], [60, 90, 40], [10, 40, 30], [20, 30, 80]], dtype=float)
    sc = np.stack([val, test], axis=-1)[None]  # one seed
    s = summarize(sc, np.array([0, 0, 1, 1]), ["a", "b"], [(0.0,), (0.5,), (1.0,)])
    # shared on validation: vector means 50, 25, 67.5 -> vector 2; its test accuracy (50 + 40 + 30 + 80) / 4
    assert s["choices"]["shared"]["val"] == [50.0]
    # per domain: a -> vector 0 (test 70, 60), b -> vector 2 (test 30, 80)
    assert s["choices"]["per domain"]["val"] == [60.0] and s["choices"]["per domain"]["gain"] == [10.0]
    # per client on validation: 0, 0, 2, 2 -> the same as per domain; bounds: shared best on test is vector 1 (63.75),
    # per client best on test: 95, 90, 40, 80
    assert s["choices"]["per client"]["val"] == [60.0] and s["choices"]["shared"]["bound"] == [63.75]
    assert s["choices"]["per client"]["bound"] == [76.25]
    assert s["domains"]["a"]["vector"] == [[0.0]] and s["domains"]["b"]["vector"] == [[1.0]]
