"""`fedl2p flower import`: a deployment's result becomes a meta-train artifact that personalize can use (no flwr
needed: the folder is what the ServerApp writes)."""

import json

import numpy as np
import torch

from fedl2p_cli import plugins
from fedl2p_cli.artifacts import Store
from fedl2p_cli.catalog import META_HEAD
from fedl2p_cli.cli.main import run_cli
from fedl2p_cli.flower import app as flower_app
from fedl2p_cli.io import weights
from fedl2p_cli.stages import meta_train, personalize

from .helpers import execute, handed, old_meta


def deployment(tiny_store, out, perturb=0.01):
    """A run config folder as `fedl2p flower run-config` writes it, with the results a ServerApp writes."""
    # its own variant name (beta_init 0.7): other tests that ask the shared tiny store for "fedl2p" must not get it
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5,
                                            meta=old_meta(epochs=1, batch_size=16, base_lr=0.01, beta_init=0.7))
    rc = flower_app.run_config(tiny_store["store"], tiny_store["pretrain"].id, cfg, 2, out, handed())
    (out / "run.toml").write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in rc.items()))
    spec = json.loads(rc["model"])
    lam = meta_train.initial_lambda(cfg, plugins.current().get(META_HEAD, cfg.meta.head), spec["n_bn"], spec["n_x"], len(spec["params"]))
    g = torch.Generator().manual_seed(1)
    weights.save(out / "lambda.safetensors", {k: v + perturb * torch.randn(v.shape, generator=g) for k, v in lam.items()})
    (out / "history.csv").write_text("round,val_loss\n1,2.0\n2,1.9\n")
    return cfg


def test_a_deployments_result_is_imported_and_personalized(tiny_store, tmp_path, capsys, monkeypatch):
    store = tiny_store["store"]
    cfg = deployment(tiny_store, tmp_path / "deploy")
    monkeypatch.setenv("FEDL2P_STORE", str(store.root))
    assert run_cli(["flower", "import", str(tmp_path / "deploy")]) == 0
    art = store.newest("meta-train", lambda a: a.metrics.get("engine") == "flower deployment")
    assert art.parents == {"pretrain": tiny_store["pretrain"].id} and art.metrics["rounds_run"] == 2
    assert art.config["variant"] == cfg.variant() and len(art.config["deployment"]["lambda_sha256"]) == 64
    got = weights.load(art.file("lambda.safetensors"))
    assert all(torch.equal(got[k], v) for k, v in weights.load(tmp_path / "deploy" / "lambda.safetensors").items())
    assert run_cli(["flower", "import", str(tmp_path / "deploy")]) == 0 and "reused" in capsys.readouterr().out
    p, _ = execute(personalize, personalize.PersonalizeConfig(methods=["ft-bnc"], epochs=1, batch_size=16, base_lr=0.01,
                                                              seeds=[0]), store,
                   {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id, "meta": [art.id]})
    _, r = personalize.load(store, p.id)
    assert p.parents[f"meta-train:{cfg.variant()}"] == art.id and not np.isnan(r.acc_after).any()


def test_a_folder_that_is_not_a_deployments_result_is_refused_in_one_line(tiny_store, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FEDL2P_STORE", str(tiny_store["store"].root))
    before = sorted(Store(tiny_store["store"].root).ids("meta-train"))
    (tmp_path / "empty").mkdir()
    cases = [(tmp_path / "empty", "has no run.toml")]
    deployment(tiny_store, tmp_path / "wrong")
    weights.save(tmp_path / "wrong" / "lambda.safetensors", {"eta": torch.zeros(3)})
    cases.append((tmp_path / "wrong", "does not hold the meta-nets of this run config"))
    for folder, expect in cases:
        capsys.readouterr()
        assert run_cli(["flower", "import", str(folder)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and expect in err, err
    assert sorted(Store(tiny_store["store"].root).ids("meta-train")) == before


def test_personalize_with_meta_after_import_and_the_default_methods(tiny_store, tmp_path, capsys, monkeypatch):
    """The deployment guide's last step: `flower import`, then `personalize --meta ID` with the default --methods
    (which name the default run's variant, not the imported run's): the imported meta-nets are a row of the table,
    in a store that has no meta-train artifact of the default variant (a deployment's operator trained none)."""
    import shutil
    store = Store(tmp_path / "store")
    for stage in ("partition", "pretrain", "stats"):
        shutil.copytree(tiny_store["store"].root / stage, store.root / stage)
    cfg = deployment(dict(tiny_store, store=store), tmp_path / "deploy")
    monkeypatch.setenv("FEDL2P_STORE", str(store.root))
    assert run_cli(["flower", "import", str(tmp_path / "deploy")]) == 0
    art = store.newest("meta-train", lambda a: a.metrics.get("engine") == "flower deployment")
    capsys.readouterr()
    code = run_cli(["personalize", "--meta", art.id, "--pretrain", tiny_store["pretrain"].id, "--stats",
                    tiny_store["stats"].id, "--epochs", "1", "--batch-size", "16", "--seeds", "0"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert cfg.variant() in out
