"""A tiny end-to-end store built once per session (sklearn digits, 3 generated domains, small-cnn)."""

from __future__ import annotations

import os

import pytest
import torch

from fedl2p_cli.artifacts import Store
from fedl2p_cli.configs import meta_of
from fedl2p_cli.stages import meta_train, partition, personalize, pretrain, stats

from .helpers import execute

# the suite computes on the CPU even where a GPU is present (the CLI's default `auto` would pick it and keep it for
# the rest of the worker's tests); tests/test_cuda.py asks for CUDA itself
os.environ.setdefault("FEDL2P_DEVICE", "cpu")

# under pytest-xdist (`make test`: two workers) one torch thread per worker, else two
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)

TINY_PARTITION = dict(dataset="digits-c", alpha=0.5, clients=12, samples_per_client=40, unseen_fraction=0.25,
                      corruptions=["clean", "invert", "contrast"], severity=4, seed=0)
TINY_PRETRAIN = dict(rounds=3, fraction=0.5, batch_size=16, eval_every=1, seed=0)
# the paper's meta-gradient and beta init (the defaults are FOMAML+ from 0.9): the IFT's second-order path is the one
# most tests read, and the pinned ids (tests/test_any_model.py) are of this run
# the paper's client update (--preset paper's MetaConfig keys), small: what the suite's runs were written against
TINY_META = meta_of("paper", epochs=1, batch_size=16, base_lr=0.01)


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("store"))
    part, _ = execute(partition, partition.PartitionConfig(**TINY_PARTITION), store, plot=False)
    pre, _ = execute(pretrain, pretrain.PretrainConfig(**TINY_PRETRAIN), store, {"partition": part.id}, plot=False)
    st, _ = execute(stats, stats.StatsConfig(), store, {"partition": part.id, "pretrain": pre.id})
    meta, _ = execute(meta_train, meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5, meta=TINY_META), store,
                      {"pretrain": pre.id, "stats": st.id})
    pcfg = personalize.PersonalizeConfig(epochs=1, batch_size=16, base_lr=0.01, seeds=[0],
                                         methods=["ft-bnc", "ft-bng", "ft-bni", "fedl2p"])
    pers, _ = execute(personalize, pcfg, store, {"pretrain": pre.id, "stats": st.id, "meta": [meta.id]})
    return {"store": store, "partition": part, "pretrain": pre, "stats": st, "meta": meta, "personalize": pers}


@pytest.fixture(autouse=True)
def _torch_threads_per_test():
    """A command run in-process sets torch's threads (Runtime.apply); the next test starts from the suite's own
    setting, so results that depend on summation order do not depend on which test ran before."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _allow_list_per_test():
    """The context catalog's allow list (FEDL2P_ALLOW_IMPORT where it was filled): between tests it starts again from
    what it was."""
    from fedl2p_cli import plugins
    catalog = plugins.current()
    before = catalog.allowed
    yield
    catalog.allowed = before
