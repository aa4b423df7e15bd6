"""--meta-signal: what each client's meta-gradient says to the federation. `log-loss` divides a client's gradient by
its validation loss (d log L_V), one client at a time and batched alike; `loss` (the paper's) leaves every id as it
was; a plugin's signal is one registration through the same catalog."""

from __future__ import annotations

import dataclasses
import shutil

import torch

from fedl2p_cli import plugins
from fedl2p_cli.algorithms.meta_signals import LOSS_FLOOR, LogLoss
from fedl2p_cli.artifacts import Store
from fedl2p_cli.io import weights
from fedl2p_cli.runtime import Runtime
from fedl2p_cli.stages import meta_train
from fedl2p_cli.stages.common import config_dict
from fedl2p_cli.stages.interface import Inputs, StageContext, run_stage

from .conftest import TINY_META
from .test_log_head import LogClient


def test_log_loss_sends_the_gradient_of_the_log_validation_loss():
    c = LogClient.make("trajectory")
    _, ft = c.tune(1.0)
    cat = plugins.build()
    plain = meta_train.meta_gradient_of(dataclasses.replace(c.cfg, meta_signal="loss"), cat)
    logged = meta_train.meta_gradient_of(dataclasses.replace(c.cfg, meta_signal="log-loss"), cat)
    a, b = (m.one(c.model, ft, c.lam, c.hyper, c.data, c.cfg, torch.Generator().manual_seed(4)) for m in (plain, logged))
    loss = float(a.val_loss)
    assert loss > LOSS_FLOOR and float(b.val_loss) == loss
    for k, g in a.grads.items():
        assert torch.allclose(b.grads[k], g / loss), k
    assert float(a.grads["logeta"].abs().max()) > 1e-6
    small = LogLoss().weigh({"w": torch.ones(2)}, torch.tensor(1e-5))
    assert torch.equal(small["w"], torch.full((2,), 1 / LOSS_FLOOR))  # a near-zero loss is floored: at most x100


@dataclasses.dataclass(frozen=True)
class Halved:
    """A test's signal: half of each client's gradient."""
    name: str = "halved"
    about: str = "a test's signal"
    calls: list = dataclasses.field(default_factory=list, compare=False)

    def weigh(self, grads, val_loss):
        self.calls.append(float(val_loss))
        return {k: 0.5 * g for k, g in grads.items()}


def _run(store, cfg, catalog=None, batched=False, tiny=None):
    catalog = catalog or plugins.build()
    rt = Runtime(engine="batched", client_batch=4, catalog=catalog) if batched else Runtime(catalog=catalog)
    inputs = Inputs.given({"pretrain": tiny["pretrain"].id, "stats": tiny["stats"].id})
    art, _ = run_stage(meta_train, cfg, inputs, StageContext(store, rt, force=batched))
    return art, weights.load(art.file("lambda.safetensors"))


def test_a_signal_names_its_variant_runs_batched_alike_and_the_papers_keeps_ids(tiny_store, tmp_path):
    shutil.copytree(tiny_store["store"].root, tmp_path / "s")
    store = Store(tmp_path / "s")
    meta = dataclasses.replace(TINY_META, meta_grad="fomaml", head="log", lr_grad="trajectory")
    base = meta_train.MetaTrainConfig.preset("fomaml", rounds=1, fraction=0.5, keep="last", meta=meta)
    assert "meta_signal" not in config_dict(base)["meta"]  # the paper's signal: ids made before the option stay
    cfg = dataclasses.replace(base, meta=dataclasses.replace(meta, meta_signal="log-loss"))
    assert "logloss" in cfg.variant().split("-") and "logloss" not in base.variant().split("-")
    one, lam_one = _run(store, cfg, tiny=tiny_store)
    many, lam_many = _run(store, cfg, batched=True, tiny=tiny_store)
    _, lam_plain = _run(store, base, tiny=tiny_store)
    assert one.id == many.id
    assert all(torch.allclose(lam_one[k], lam_many[k], atol=1e-5, rtol=1e-4) for k in lam_one)
    assert any(not torch.allclose(lam_one[k], lam_plain[k]) for k in lam_one)  # the signal changed the step

    entry = Halved()
    catalog = plugins.build(lambda r: r.add_meta_signal(entry))
    mine = dataclasses.replace(base, meta=dataclasses.replace(meta, meta_signal="halved"))
    art, _ = _run(store, mine, catalog=catalog, tiny=tiny_store)
    assert entry.calls and "halved" in art.metrics["variant"].split("-") and art.manifest.get("plugins")
