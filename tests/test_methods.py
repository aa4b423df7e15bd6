"""The method registry (fedl2p_cli/methods): every question about a method is answered there, so a new method is
one object and one registration; shown here by adding one in a test and running it through `personalize`."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from fedl2p_cli import methods, plugins
from fedl2p_cli.artifacts import Store
from fedl2p_cli.catalog import UnknownName
from fedl2p_cli.core.finetune import Strategy, finetune, personalized_accuracy
from fedl2p_cli.engine.loop import generator
from fedl2p_cli.models.registry import head_prefix
from fedl2p_cli.stages import partition, personalize, pretrain, stats

from .helpers import execute, old_meta


def test_the_builtin_methods():
    cat = plugins.current()
    assert methods.baselines(cat) == ("ft-bnc", "ft-bng", "ft-bni")
    assert methods.handmade(cat) == ("ft-bnc", "ft-bng", "ft-bni", "ft-tuned")
    assert methods.systems(cat) == ("pfedla", "heurpfedla", "cafeme")
    assert [methods.label(m, cat) for m in methods.handmade(cat)] == ["FT (BN C)", "FT (BN G)", "FT (BN I)", "FT tuned (val)"]
    # a meta-train variant belongs to the family its options say (not to a prefix of its printed name); L2P and
    # pFedLA have nothing for clients they never trained
    from fedl2p_cli.configs import MetaTrainConfig
    fo = MetaTrainConfig.preset("fomaml", meta=old_meta(meta_grad="fomaml", beta_init=0.5, init_gain=1.0), input_norm="standardize",
                         keep="last")
    assert fo.variant() == "fedl2p-fomaml-std-last-gain1" and methods.learned(fo.family(), cat) is methods.get("fedl2p", cat)
    local = MetaTrainConfig.preset("fomaml", meta=old_meta(meta_grad="fomaml", beta_init=0.5), local=True)
    assert local.variant() == "l2p-fomaml" and methods.learned(local.family(), cat) is methods.get("l2p", cat)
    assert methods.find("fedl2p-fomaml", cat) is None and methods.find("fedl2p-tbs", cat) is None and methods.find("ft-bnx", cat) is None
    with pytest.raises(UnknownName, match="unknown method 'ft-bnx' \\(--methods\\); choose one of: ft-bnc, ft-bng"):
        methods.get("ft-bnx", cat)
    assert not methods.get("l2p", cat).supports("unseen") and not methods.get("pfedla", cat).supports("unseen")
    assert methods.get("cafeme", cat).supports("unseen") and methods.get("fedl2p", cat).supports("unseen")


def test_a_new_method_is_one_registration(tiny_store, tmp_path):
    """A hand-made strategy nobody wrote before (beta 0.5 in every layer, half the LR), registered here and nowhere
    else: `personalize` runs it on every client with the same batches as the others, its row carries its label, its
    beta is recorded, and its accuracy is the one a direct fine-tune under that strategy gets."""
    def register(registry):
        registry.add_method(methods.HandMade("ft-half", "FT (half)", beta=0.5, lr_factor=0.5, baseline=False))

    with plugins.using(plugins.build(register)):
        check_a_new_method(tiny_store, tmp_path)
    assert methods.find("ft-half", plugins.current()) is None  # registered in the test's own catalog only


def check_a_new_method(tiny_store, tmp_path):
    shutil.copytree(tiny_store["store"].root, tmp_path / "s")
    store, pre, st = Store(tmp_path / "s"), tiny_store["pretrain"].id, tiny_store["stats"].id
    cfg = personalize.PersonalizeConfig(methods=["ft-bnc", "ft-half"], epochs=1, batch_size=16, base_lr=0.01, seeds=[0])
    art, _ = execute(personalize, cfg, store, {"pretrain": pre, "stats": st})
    _, r = personalize.load(store, art.id)
    assert r.methods == ["ft-bnc", "ft-half"]
    np.testing.assert_array_equal(r.beta["ft-half"], 0.5)
    np.testing.assert_allclose(r.eta["ft-half"], 0.005)
    assert "| FT (half) |" in art.file("summary.md").read_text()
    _, part = partition.load(store, tiny_store["partition"].id)
    _, model, state = pretrain.load(store, pre, plugins.current())
    _, table = stats.load(store, st)
    theta = {n: state[n] for n, _ in model.named_parameters()}
    c = int(r.client[0])
    data, s = part.client(c), Strategy(torch.full((3,), 0.5), torch.full((len(theta),), 0.005))
    ft = finetune(model.eval(), theta, *data.train, s, table.client_bn(c), 1, 16, generator(0, c, 7), "precise")
    want = personalized_accuracy(model, ft.params, *data.test, s, ft.bn, 16)[1]
    assert r.acc_after[1, 0, 0] == pytest.approx(want, abs=1e-9)
    assert methods.get("ft-half", plugins.current()).label == "FT (half)"


def test_a_handmade_method_may_fine_tune_some_tensors_only(tiny_store, tmp_path):
    """`HandMade.tensors` picks the parameter tensors a method fine-tunes from the model (here: the classifier); the
    others keep LR 0, so they stay at the global model's values, and the row is the direct fine-tune's accuracy."""
    head = lambda model: [n for n, _ in model.named_parameters() if n.startswith(head_prefix(model))]  # noqa: E731
    catalog = plugins.build(lambda registry: registry.add_method(
        methods.HandMade("ft-head", "FT (head)", beta=1.0, baseline=False, tensors=head)))
    with plugins.using(catalog):  # the artifact names the test's plugin: it is loaded where the artifact is read
        check_some_tensors(tiny_store, tmp_path, head)


def check_some_tensors(tiny_store, tmp_path, head):
    shutil.copytree(tiny_store["store"].root, tmp_path / "s")
    store, pre, st = Store(tmp_path / "s"), tiny_store["pretrain"].id, tiny_store["stats"].id
    cfg = personalize.PersonalizeConfig(methods=["ft-head"], epochs=1, batch_size=16, base_lr=0.01, seeds=[0])
    art, _ = execute(personalize, cfg, store, {"pretrain": pre, "stats": st})
    _, r = personalize.load(store, art.id)
    _, model, state = pretrain.load(store, pre, plugins.current())
    names = [n for n, _ in model.named_parameters()]
    chosen = np.array([n in head(model) for n in names])
    assert 0 < chosen.sum() < len(names)
    np.testing.assert_allclose(r.eta["ft-head"][:, chosen], 0.01)
    np.testing.assert_array_equal(r.eta["ft-head"][:, ~chosen], 0.0)
    _, part = partition.load(store, tiny_store["partition"].id)
    _, table = stats.load(store, st)
    theta = {n: state[n] for n in names}
    c = int(r.client[0])
    s = Strategy(torch.ones(3), torch.tensor(chosen, dtype=torch.float32) * 0.01)
    ft = finetune(model.eval(), theta, *part.client(c).train, s, table.client_bn(c), 1, 16, generator(0, c, 7), "precise")
    assert all(torch.equal(ft.params[n], theta[n]) for n, keep in zip(names, chosen) if not keep)
    want = personalized_accuracy(model, ft.params, *part.client(c).test, s, ft.bn, 16)[1]
    assert r.acc_after[0, 0, 0] == pytest.approx(want, abs=1e-9)


def test_a_learned_methods_name_means_its_newest_run_of_any_variant(tiny_store, tmp_path):
    """`--methods ft-bnc,fedl2p` after a default `fedl2p meta-train`: `fedl2p` is the newest FedL2P run of the model,
    whatever its variant, and its row carries the variant's name (the default run is fedl2p-fomaml-binit0.9)."""
    from fedl2p_cli.configs import DEFAULT_METHODS
    from fedl2p_cli.stages import meta_train
    assert DEFAULT_METHODS[-1] == "fedl2p"
    shutil.copytree(tiny_store["store"].root, tmp_path / "s")
    store, pre, st = Store(tmp_path / "s"), tiny_store["pretrain"].id, tiny_store["stats"].id
    mcfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=1, fraction=0.5, meta=old_meta(epochs=1, batch_size=16, base_lr=0.01))
    meta, _ = execute(meta_train, mcfg, store, {"pretrain": pre, "stats": st})
    assert meta.metrics["variant"] == "fedl2p-fomaml-binit0.9"
    cfg = personalize.PersonalizeConfig(methods=["ft-bnc", "fedl2p"], epochs=1, batch_size=16, base_lr=0.01, seeds=[0])
    art, _ = execute(personalize, cfg, store, {"pretrain": pre, "stats": st})
    _, r = personalize.load(store, art.id)
    assert r.methods == ["ft-bnc", "fedl2p-fomaml-binit0.9"] and art.parents["meta-train:fedl2p-fomaml-binit0.9"] == meta.id
    # given by id, any FedL2P variant answers the default --methods' `fedl2p`
    art2, _ = execute(personalize, personalize.PersonalizeConfig(epochs=1, batch_size=16, base_lr=0.01, seeds=[0]), store,
                      {"pretrain": pre, "stats": st, "meta": [tiny_store["meta"].id]})
    assert personalize.load(store, art2.id)[1].methods[-1] == tiny_store["meta"].metrics["variant"]


def test_a_checked_learned_strategy_picks_by_validation(tiny_store, tmp_path, monkeypatch):
    """fedl2p-checked: beside the learned row, each client fine-tunes under the learned strategy at its LRs x0.1, x1
    and x10 and keeps the one (or no fine-tuning) with the best validation accuracy; its test accuracy is that one's.
    Its x1 is the learned row's own fine-tuning, computed once."""
    from fedl2p_cli.core.finetune import evaluate
    from fedl2p_cli.core.selection import select_by_validation
    from fedl2p_cli.stages import harness
    runs, one = [], harness.finetune
    monkeypatch.setattr(harness, "finetune", lambda *a, **k: runs.append(1) or one(*a, **k))
    shutil.copytree(tiny_store["store"].root, tmp_path / "s")
    store, pre, st, meta = Store(tmp_path / "s"), tiny_store["pretrain"].id, tiny_store["stats"].id, tiny_store["meta"]
    cfg = personalize.PersonalizeConfig(methods=["ft-bnc", "fedl2p-checked"], epochs=1, batch_size=16, base_lr=0.01, seeds=[0])
    art, _ = execute(personalize, cfg, store, {"pretrain": pre, "stats": st, "meta": [meta.id]})
    _, r = personalize.load(store, art.id)
    v = meta.metrics["variant"]
    assert r.methods == ["ft-bnc", v, f"{v}-checked"]
    assert len(runs) == 4 * len(r.client)  # ft-bnc, the learned row (the check's x1), the check's x0.1 and x10
    np.testing.assert_array_equal(r.beta[v], r.beta[f"{v}-checked"])
    _, part = partition.load(store, tiny_store["partition"].id)
    _, model, state = pretrain.load(store, pre, plugins.current())
    _, table = stats.load(store, st)
    theta = {n: state[n] for n, _ in model.named_parameters()}
    picks_differ = False
    for j in range(len(r.client)):
        c = int(r.client[j])
        data = part.client(c)
        beta, lr = torch.as_tensor(r.beta[v][j]), torch.as_tensor(r.eta[v][j])
        scores = []
        for f in (0.1, 1.0, 10.0):
            s = Strategy(beta, lr * f)
            ft = finetune(model.eval(), theta, *data.train, s, table.client_bn(c), 1, 16, generator(0, c, 7), "precise")
            scores.append((*personalized_accuracy(model, ft.params, *data.val, s, ft.bn, 16),
                           personalized_accuracy(model, ft.params, *data.test, s, ft.bn, 16)[1]))
        scores.append((*evaluate(model, theta, *data.val), evaluate(model, theta, *data.test)[1]))
        out = np.array(scores)
        want = out[select_by_validation(out[:, 1], out[:, 0]), 2]
        assert r.acc_after[2, 0, j] == pytest.approx(want, abs=1e-6)
        picks_differ |= want != out[:, 2].max()
    assert picks_differ  # some client's validation pick is not its best on test: the test could tell them apart
