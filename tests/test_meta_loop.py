"""FedL2P's federated loop (algorithms/meta_loop.py) is one object that the meta-train stage and Flower's ServerApp
both run (issue 80). The ServerApp hands it its sites, a `Federation` holding no client data, where it used to build
a stage's Context from Nones behind a `type: ignore`."""

from __future__ import annotations

import torch

from fedl2p_cli import plugins
from fedl2p_cli.algorithms.fedl2p import ClientResult
from fedl2p_cli.algorithms.meta_loop import MetaReply, MetaStrategy, kept_lambda
from fedl2p_cli.catalog import AGGREGATOR, SERVER_STEP
from fedl2p_cli.configs import MetaTrainConfig
from fedl2p_cli.core.client import Timer
from fedl2p_cli.engine.loop import group_of
from fedl2p_cli.flower import app as flower_app


def reply(c: int, n: int, loss: float) -> MetaReply:
    """Site c's answer: lambda moved to c everywhere, on n samples (a claim: the server knows no site's size)."""
    return MetaReply(ClientResult({"w": torch.full((2,), float(c))}, n, loss, loss, torch.ones(1), torch.ones(1), {}), {})


def test_the_servers_sites_run_the_loop_without_client_data():
    cfg = MetaTrainConfig(rounds=1, fraction=1.0, keep="last", client_weights="samples")
    cat = plugins.build()
    sites = flower_app._Sites(cfg, cat.get(SERVER_STEP, cfg.meta_opt), cat.get(AGGREGATOR, cfg.aggregator), (3, 5))
    strategy = MetaStrategy(sites, {"w": torch.zeros(2)})
    st = strategy.initial_state()
    tasks = strategy.configure(st, 0)
    assert sorted(t.client for t in tasks) == [3, 5]
    rec = strategy.aggregate(st, 0, tasks, [reply(t.client, 1 if t.client == 3 else 3, 0.5) for t in tasks], Timer())
    assert rec is not None and rec["val_loss"] == 0.5 and "dropped" not in rec  # every claimed size accepted
    assert rec["sampled"] == " ".join(str(t.client) for t in tasks)
    lam = kept_lambda(cfg, st)
    assert torch.equal(lam["w"], group_of(st.tensors, "lam")["w"]) and not torch.equal(lam["w"], torch.zeros(2))
