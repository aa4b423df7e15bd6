"""The meta-nets' inputs as a catalog entry (`meta-train --input-norm NAME`): a plugin's entry takes the built-ins'
path through meta-training (one client at a time and batched), the stored lambda and personalisation; a bad entry
is refused where it enters."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

from fedl2p_cli import plugins
from fedl2p_cli.algorithms import meta_inputs
from fedl2p_cli.artifacts import Store
from fedl2p_cli.catalog import UnknownName
from fedl2p_cli.core.metanets import input_normalizer, normalize_inputs
from fedl2p_cli.errors import FedL2PError
from fedl2p_cli.runtime import Runtime
from fedl2p_cli.stages import meta_train, personalize
from fedl2p_cli.stages.interface import Inputs, StageContext, reading, run_stage

from .conftest import TINY_META
from .helpers import handed


@dataclasses.dataclass
class LogMoments:
    """A user's inputs: x z-scored, and beside it log|x| z-scored (LRNet reads twice the statistics' width)."""
    name: str = "log-moments"
    about: str = "x and log|x|, each z-scored over the seen clients"
    applied: list = dataclasses.field(default_factory=list)

    def fit(self, xi, x):
        lx = x.abs().clamp_min(1e-6).log()
        return {"x_mean": x.mean(0), "x_sd": x.std(0).clamp_min(1e-6), "lx_mean": lx.mean(0), "lx_sd": lx.std(0).clamp_min(1e-6)}

    def apply(self, state, xi, x):
        self.applied.append(tuple(x.shape))
        lx = x.abs().clamp_min(1e-6).log()
        return xi, torch.cat([(x - state["x_mean"]) / state["x_sd"], (lx - state["lx_mean"]) / state["lx_sd"]])


@dataclasses.dataclass(frozen=True)
class Broken:
    """BNNet's input must stay one value per BN layer."""
    name: str = "broken"
    about: str = "drops a BN layer"

    def fit(self, xi, x):
        return {}

    def apply(self, state, xi, x):
        return xi[1:], x


def test_the_built_ins_are_the_paper_and_the_standardisations():
    xi, x = torch.rand(6, 3) + 0.1, torch.rand(6, 8) * 100
    entries = {e.name: e for e in meta_inputs.BUILTIN}
    raw = entries["none"].apply({}, xi[0], x[0])
    assert entries["none"].fit(xi, x) == {} and raw[0] is xi[0] or torch.equal(raw[0], xi[0]) and torch.equal(raw[1], x[0])
    for name, robust in (("standardize", False), ("robust", True)):
        state = entries[name].fit(xi, x)
        assert state.keys() == input_normalizer(xi, x, robust=robust).keys()
        got, want = entries[name].apply(state, xi[0], x[0]), normalize_inputs(input_normalizer(xi, x, robust), xi[0], x[0])
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_meta_net_inputs_are_one_registration(tiny_store, tmp_path):
    entry = LogMoments()
    catalog = plugins.build(lambda r: r.add_meta_inputs(entry))
    shutil.copytree(tiny_store["store"].root, tmp_path / "s")
    store = Store(tmp_path / "s")
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=1, fraction=0.5, keep="last", input_norm="log-moments",
                                     meta=dataclasses.replace(TINY_META, meta_grad="fomaml", head="log"))
    assert "log-moments" in cfg.variant()
    given = {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id}
    one, _ = run_stage(meta_train, cfg, Inputs.given(given), StageContext(store, Runtime(catalog=catalog)))
    many, _ = run_stage(meta_train, cfg, Inputs.given(given),
                        StageContext(store, Runtime(engine="batched", client_batch=4, catalog=catalog), force=True))
    assert one.id == many.id and one.manifest.get("plugins")
    _, lam, norm = meta_train.load_lambda(store, one.id, catalog)  # its plugin checked against the catalog handed
    n_x = reading(store, "stats", tiny_store["stats"].id, catalog).value.x.shape[1]
    assert set(norm) == {"x_mean", "x_sd", "lx_mean", "lx_sd"} and norm["x_mean"].shape == (n_x,)
    assert lam["lrnet.0.weight"].shape[1] == 2 * n_x  # LRNet was drawn for the entry's width

    entry.applied.clear()
    pcfg = personalize.PersonalizeConfig(epochs=1, batch_size=16, base_lr=0.01, seeds=[0], methods=["ft-bni"], unseen=True)
    pers, _ = run_stage(personalize, pcfg, Inputs.given(given | {"meta": [one.id]}),
                        StageContext(store, Runtime(catalog=catalog)))
    row = json.loads(pers.file("summary.json").read_text())["methods"][cfg.variant()]
    assert entry.applied and "spread" in row and "spread_round0" in row  # unseen clients mapped by the stored state

    with pytest.raises(UnknownName, match="--input-norm"):  # not in this catalog: one line naming the choices
        meta_train.check(cfg, handed())


def test_an_entry_that_drops_a_bn_input_is_refused(tiny_store, tmp_path):
    catalog = plugins.build(lambda r: r.add_meta_inputs(Broken()))
    shutil.copytree(tiny_store["store"].root, tmp_path / "s")
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=1, fraction=0.5, input_norm="broken", meta=TINY_META)
    given = {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id}
    store = Store(tmp_path / "s")
    with pytest.raises(FedL2PError, match=r"--input-norm broken: apply must give BNNet one input per BN layer"):
        run_stage(meta_train, cfg, Inputs.given(given), StageContext(store, Runtime(catalog=catalog)))
    assert not [a for a in store.iter("meta-train") if a.config.get("input_norm") == "broken"]  # nothing half-written
