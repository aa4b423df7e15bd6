"""A new personalised-FL system is one module and one registration: tests/toy_system.py, registered here only, is
trained by `pfl-train`'s stage, stored, reloaded and evaluated by `personalize` beside the FT baselines."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from fedl2p_cli import methods, plugins
from fedl2p_cli.artifacts import Store
from fedl2p_cli.configs import PFLConfig
from fedl2p_cli.errors import FedL2PError
from fedl2p_cli.stages import partition, personalize, pfl

from . import toy_system


def register(registry):
    registry.add_system(methods.System("toy-fedavg", "Toy FedAvg", trainer="tests.toy_system"))


def test_a_new_system_is_one_module_and_one_registration(tiny_store, tmp_path):
    shutil.copytree(tiny_store["store"].root, tmp_path / "s")
    store, part_id = Store(tmp_path / "s"), tiny_store["partition"].id
    cfg = PFLConfig(algo="toy-fedavg", rounds=2, fraction=0.5, local_epochs=1, batch_size=16, lr=0.05)
    with pytest.raises(FedL2PError, match="unknown pFL system 'toy-fedavg' \\(--algo\\); choose one of: pfedla"):
        pfl.run(cfg, store, part_id)
    with plugins.using(plugins.build(register)):
        trained_and_evaluated(cfg, store, part_id, tiny_store)


def trained_and_evaluated(cfg, store, part_id, tiny_store):
    art, reused = pfl.run(cfg, store, part_id)
    assert not reused and pfl.run(cfg, store, part_id)[1] and art.file("model.safetensors").is_file()
    assert set(art.config) >= {"local_epochs", "lr"} and "hn_lr" not in art.config  # its own settings only
    pcfg = personalize.PersonalizeConfig(methods=["ft-bnc", "toy-fedavg"], epochs=1, batch_size=16, base_lr=0.01, seeds=[0])
    pers, _ = personalize.run(pcfg, store, tiny_store["pretrain"].id, tiny_store["stats"].id)
    _, r = personalize.load(store, pers.id)
    assert r.methods == ["ft-bnc", "toy-fedavg"] and "| Toy FedAvg |" in pers.file("summary.md").read_text()
    t = pfl.load(store, art.id)
    _, p = partition.load(store, part_id)
    want = [toy_system.accuracy(t, int(c), p.client(int(c)), 0, 1) for c in r.client]
    np.testing.assert_allclose(r.acc_after[1, 0], want)
