"""What a client's own check picked: fedl2p-checked's LR factor and ft-tuned's recipe per kind of client, recorded in
results.h5 and the summary; and a learned row's spread beside its round-0 control."""

from __future__ import annotations

import numpy as np

from fedl2p_cli.analysis import picks
from fedl2p_cli.stages import personalize

from .helpers import execute


def _trials(best: list[list[int]], k: int) -> np.ndarray:
    """[S, C, k, 3] trials whose validation accuracy is highest at `best[s][c]`."""
    s, c = len(best), len(best[0])
    out = np.zeros((s, c, k, 3))
    out[..., 0] = 1.0
    for i in range(s):
        for j in range(c):
            out[i, j, best[i][j], 1] = 0.9
    return out


def test_checked_picks_are_counted_per_kind():
    trials = _trials([[0, 1, 2, 3], [1, 1, 2, 2]], 4)  # factors x0.1, x1, x10, then no fine-tuning
    got = picks.checked(trials, np.array([0, 0, 1, 1]), ["clean", "invert"])
    assert got == {"clean": {"×0.1": 1, "×1": 3}, "invert": {"×10": 3, "none": 1}}


def test_ft_tuned_grid_edge_is_the_share_of_clients_at_x10():
    # candidates(): BN C x0.1, x1, x10, BN G x0.1, x1, x10, BN I x0.1, x1, x10, none
    cands = _trials([[2, 1, 8, 5]], 10)
    edge = picks.tuned_edge(cands, np.array([0, 0, 1, 1]), ["clean", "invert"])
    assert edge == {"clean": 0.5, "invert": 1.0, "all": 0.75}


def test_personalize_records_the_checked_picks_and_the_round_0_control(tiny_store):
    """A personalisation with fedl2p-checked and ft-tuned: results.h5 keeps the checked row's trials, the summary
    counts its picks per kind and ft-tuned's picks at the grid's edge, and the learned row's spread has its round-0
    control beside it."""
    cfg = personalize.PersonalizeConfig(epochs=1, batch_size=16, base_lr=0.01, seeds=[0],
                                        methods=["ft-tuned", "fedl2p", "fedl2p-checked"])
    art, _ = execute(personalize, cfg, tiny_store["store"],
                     {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id, "meta": [tiny_store["meta"].id]})
    _, r = personalize.load(tiny_store["store"], art.id)
    checked = [m for m in r.methods if m.endswith("-checked")]
    assert checked and set(r.checked) == set(checked)
    assert r.checked[checked[0]].shape == (1, len(r.client), 4, 3)
    import json
    s = json.loads(art.file("summary.json").read_text())
    counts = s["methods"][checked[0]]["picks"]
    assert sum(sum(c.values()) for c in counts.values()) == len(r.client)
    assert "edge" in s["methods"]["ft-tuned"]
    learned = checked[0][: -len("-checked")]
    assert "beta_split_domains" in s["methods"][learned]["spread_round0"]
    text = art.file("summary.md").read_text()
    assert "(round 0: " in text and "picked (seed × client, per kind)" in text


def test_analyze_clusters_prints_the_round_0_control(tiny_store):
    """`fedl2p analyze clusters` reads the control personalize recorded and prints it beside the spread."""
    from fedl2p_cli.configs import ClustersConfig
    from fedl2p_cli.stages import analyze
    cfg = personalize.PersonalizeConfig(epochs=1, batch_size=16, base_lr=0.01, seeds=[0], methods=["fedl2p"])
    pers, _ = execute(personalize, cfg, tiny_store["store"],
                      {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id, "meta": [tiny_store["meta"].id]})
    art, _ = execute(analyze, ClustersConfig(), tiny_store["store"], {"personalize": pers.id})
    assert "(round 0: " in art.file("ari.md").read_text()
