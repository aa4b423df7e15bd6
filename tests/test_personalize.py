import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedl2p_cli import methods, plugins
from fedl2p_cli.core.bn import BNPolicy, MixBN
from fedl2p_cli.core.finetune import ClientBN, Strategy, eval_policy, finetune, personalized_accuracy
from fedl2p_cli.core.functional import forward
from fedl2p_cli.core.metanets import init_lambda
from fedl2p_cli.errors import USER_ERRORS, FedL2PError
from fedl2p_cli.io import weights
from fedl2p_cli.stages import personalize, pretrain, stats

from .helpers import execute, old_meta


@pytest.fixture()
def bn_model():
    torch.manual_seed(0)
    m = MixBN(3)
    m.running_mean.copy_(torch.tensor([1.0, -1.0, 0.5]))
    m.running_var.copy_(torch.tensor([4.0, 0.25, 1.0]))
    return m


def run(m, x, pol):
    return forward(m, dict(m.named_parameters()), x, pol)


def test_bn_g_uses_pretrained_statistics_in_training_and_inference(bn_model):
    x = torch.randn(8, 3, 2, 2) * 3 + 2
    ref = F.batch_norm(x, bn_model.running_mean, bn_model.running_var, bn_model.weight, bn_model.bias, False, 0, 1e-5)
    s = Strategy(torch.zeros(1), torch.zeros(2))
    assert torch.allclose(run(bn_model, x, BNPolicy(s.beta, train=True)), ref, atol=1e-6)
    client = ClientBN([torch.tensor([9.0, 9.0, 9.0])], [torch.tensor([9.0, 9.0, 9.0])])
    assert torch.allclose(run(bn_model, x, eval_policy(s, client)), ref, atol=1e-6)


def test_bn_c_uses_batch_statistics_in_training_and_client_running_in_inference(bn_model):
    x = torch.randn(8, 3, 2, 2) * 3 + 2
    s = Strategy(torch.ones(1), torch.zeros(2))
    train_ref = F.batch_norm(x, None, None, bn_model.weight, bn_model.bias, True, 0, 1e-5)
    assert torch.allclose(run(bn_model, x, BNPolicy(s.beta, train=True)), train_ref, atol=1e-5)
    cm, cv = torch.tensor([0.1, 0.2, 0.3]), torch.tensor([2.0, 3.0, 4.0])
    eval_ref = F.batch_norm(x, cm, cv, bn_model.weight, bn_model.bias, False, 0, 1e-5)
    assert torch.allclose(run(bn_model, x, eval_policy(s, ClientBN([cm], [cv]))), eval_ref, atol=1e-6)


def test_bn_i_uses_the_test_batch_statistics(bn_model):
    x = torch.randn(8, 3, 2, 2) * 3 + 2
    s = Strategy(None, torch.zeros(2))
    ref = F.batch_norm(x, None, None, bn_model.weight, bn_model.bias, True, 0, 1e-5)
    assert torch.allclose(run(bn_model, x, eval_policy(s, ClientBN([torch.zeros(3)], [torch.ones(3)]))), ref, atol=1e-5)


def test_mixing_is_eq2(bn_model):
    x = torch.randn(8, 3, 2, 2)
    cm, cv, b = torch.tensor([0.1, 0.2, 0.3]), torch.tensor([2.0, 3.0, 4.0]), 0.3
    mean = (1 - b) * bn_model.running_mean + b * cm
    var = (1 - b) * bn_model.running_var + b * cv
    ref = F.batch_norm(x, mean, var, bn_model.weight, bn_model.bias, False, 0, 1e-5)
    assert torch.allclose(run(bn_model, x, BNPolicy(torch.tensor([b]), [cm], [cv], train=False)), ref, atol=1e-6)


def test_fedl2p_with_beta0_and_base_lr_reproduces_ft_bn_g(tiny_store):
    store = tiny_store["store"]
    _, model, state = pretrain.load(store, tiny_store["pretrain"].id, plugins.current())
    _, table = stats.load(store, tiny_store["stats"].id)
    theta = {n: state[n] for n, _ in model.named_parameters()}
    n_bn, n_p = table.xi.shape[1], len(theta)
    lam = init_lambda(n_bn, table.x.shape[1], n_p, 0.01, "both", 0)
    lam["bnnet.2.weight"].zero_()
    lam["bnnet.2.bias"].fill_(-1.0)  # clamped to beta = 0
    lam["lrnet.2.weight"].zero_()
    lam["lrnet.2.bias"].fill_(1.0)   # LRNet = 1, so eta = eta~ = base LR
    cfg = personalize.PersonalizeConfig(methods=["ft-bng"], base_lr=0.01)
    setup = personalize.Setup(cfg, store, tiny_store["pretrain"].id, tiny_store["stats"].id, tiny_store["partition"].id,
                              table, torch.device("cpu"), plugins.current())
    meta = personalize.Row("fedl2p", methods.get("fedl2p", plugins.current()), None,
                           personalize.MetaNets(lam, old_meta(base_lr=0.01), None, per_client=False))
    c = 0
    strat = {r.name: r.method.strategy(r, setup, c) for r in (setup.requested("ft-bng", methods.get("ft-bng", plugins.current())), meta)}
    assert torch.equal(strat["fedl2p"].beta, torch.zeros(n_bn)) and torch.allclose(strat["fedl2p"].lr, strat["ft-bng"].lr)
    from fedl2p_cli.stages.partition import load as load_part
    _, part = load_part(store, tiny_store["partition"].id)
    data = part.client(c)
    out = {}
    for name in ("ft-bng", "fedl2p"):
        ft = finetune(model, theta, *data.train, strat[name], table.client_bn(c), 2, 16, torch.Generator().manual_seed(0))
        out[name] = (ft.params, personalized_accuracy(model, ft.params, *data.test, strat[name], ft.bn, 16))
    for k in theta:
        assert torch.equal(out["ft-bng"][0][k], out["fedl2p"][0][k]), k
    assert out["ft-bng"][1] == out["fedl2p"][1]


def test_test_batch_evaluation_of_beta_1_is_bn_i_and_of_other_betas_is_eq2_on_the_batch(tiny_store):
    """--eval-stats test-batch: a learned beta mixes each test batch's statistics with the pretrained ones; at beta 1
    that is exactly FT (BN I)'s evaluation, and it differs from the default running-statistics evaluation."""
    store = tiny_store["store"]
    _, model, state = pretrain.load(store, tiny_store["pretrain"].id, plugins.current())
    _, table = stats.load(store, tiny_store["stats"].id)
    from fedl2p_cli.stages.partition import load as load_part
    _, part = load_part(store, tiny_store["partition"].id)
    theta = {n: state[n] for n, _ in model.named_parameters()}
    n_bn, n_p, c = table.xi.shape[1], len(theta), 0
    data, lr = part.client(c), torch.full((n_p,), 0.01)
    out = {}
    for name, s in (("bni", Strategy(None, lr)), ("b1", Strategy(torch.ones(n_bn), lr)),
                    ("mixed", Strategy(torch.full((n_bn,), 0.4), lr))):
        ft = finetune(model, theta, *data.train, s, table.client_bn(c), 2, 16, torch.Generator().manual_seed(0))
        out[name] = {e: personalized_accuracy(model, ft.params, *data.test, s, ft.bn, 16, e) for e in ("running", "test-batch")}
    assert out["b1"]["test-batch"] == out["bni"]["running"] == out["bni"]["test-batch"]
    assert out["b1"]["test-batch"] != out["b1"]["running"]
    assert out["mixed"]["test-batch"] != out["mixed"]["running"]


def test_eval_stats_names_the_learned_methods_and_leaves_baselines_alone(tiny_store, tmp_path):
    import shutil

    from fedl2p_cli.artifacts import Store
    shutil.copytree(tiny_store["store"].root, tmp_path / "s")  # a copy: other tests read the newest artifacts
    store, pre, st = Store(tmp_path / "s"), tiny_store["pretrain"].id, tiny_store["stats"].id
    cfg = personalize.PersonalizeConfig(epochs=1, batch_size=16, base_lr=0.01, seeds=[0], eval_stats="test-batch")
    art, _ = execute(personalize, cfg, store, {"pretrain": pre, "stats": st, "meta": [tiny_store["meta"].id]})
    assert art.id != tiny_store["personalize"].id
    _, r = personalize.load(store, art.id)
    _, r0 = personalize.load(store, tiny_store["personalize"].id)
    assert r.methods == ["ft-bnc", "ft-bng", "ft-bni", "fedl2p-tbs"] and r.attrs["eval_stats"] == "test-batch"
    np.testing.assert_array_equal(r.acc_after[:3], r0.acc_after[:3])
    with pytest.raises(USER_ERRORS, match="unknown --eval-stats"):
        execute(personalize, personalize.PersonalizeConfig(eval_stats="batch"), store, {"pretrain": pre, "stats": st})


def test_results_and_summary(tiny_store):
    art = tiny_store["personalize"]
    _, r = personalize.load(tiny_store["store"], art.id)
    assert r.methods == ["ft-bnc", "ft-bng", "ft-bni", "fedl2p"]
    assert r.acc_after.shape == (4, 1, len(r.client)) and not np.isnan(r.acc_after).any()
    assert np.isnan(r.beta["ft-bni"]).all() and (r.beta["ft-bnc"] == 1).all()
    assert ((r.beta["fedl2p"] >= 0) & (r.beta["fedl2p"] <= 1)).all()
    md = art.file("summary.md").read_text()
    assert "FT (BN C)" in md and "fedl2p" in md


def test_summary_gives_the_learned_beta_per_domain_and_layer(tiny_store):
    """The β table beside the ARI: each domain's row is the mean β of that domain's clients, per BN layer; the
    hand-made methods (a fixed β) get none."""
    import json
    art = tiny_store["personalize"]
    _, r = personalize.load(tiny_store["store"], art.id)
    s = json.loads(art.file("summary.json").read_text())
    assert set(s["methods"]) - {"fedl2p"} == {"ft-bnc", "ft-bng", "ft-bni"}
    assert all("beta_per_domain" not in v for m, v in s["methods"].items() if m != "fedl2p")
    per_domain = s["methods"]["fedl2p"]["beta_per_domain"]
    _, cols, rows = personalize.beta_table("fedl2p", per_domain, plugins.current())
    assert cols == ["domain"] + [f"bn{i}" for i in range(r.beta["fedl2p"].shape[1])]
    md = art.file("summary.md").read_text()
    for (name, _), d in zip(per_domain.items(), np.unique(r.domain)):
        want = r.beta["fedl2p"][r.domain == d].mean(axis=0)
        assert "| " + " | ".join([name] + [f"{b:.2f}" for b in want]) + " |" in md


def test_bad_inputs(tiny_store):
    store, pre, st = tiny_store["store"], tiny_store["pretrain"].id, tiny_store["stats"].id
    with pytest.raises(FedL2PError, match="unknown method"):
        execute(personalize, personalize.PersonalizeConfig(methods=["ft-bnc", "nope"]), store, {"pretrain": pre, "stats": st})
    # meta-nets for another model shape
    d = store.draft("meta-train", {"meta": old_meta().__dict__, "fake": 1}, {"pretrain": pre})
    lam = init_lambda(5, 20, 40, 1e-3, "both", 0)
    weights.save(d.path("lambda.safetensors"), lam)
    d.metrics = {"variant": "fedl2p-other"}
    other = d.publish()
    with pytest.raises(FedL2PError, match="another model shape"):
        execute(personalize, personalize.PersonalizeConfig(methods=["ft-bnc"]), store, {"pretrain": pre, "stats": st, "meta": [other.id]})
    import shutil
    shutil.rmtree(other.path)


def test_an_untrained_variant_is_refused_naming_the_trained_ones(tiny_store):
    """A variant nobody trained: one line that names those that exist (the session's store has at least the IFT one)."""
    import pytest

    from fedl2p_cli.errors import FedL2PError
    from fedl2p_cli.stages import personalize as pers
    cfg = pers.PersonalizeConfig(methods=["ft-bnc", "fedl2p-fomaml-nb99"], epochs=1, batch_size=16, base_lr=0.01, seeds=[0])
    with pytest.raises(FedL2PError, match=r"'fedl2p-fomaml-nb99'.*this model's trained variants: (.*, )?fedl2p[ ,]"):
        execute(pers, cfg, tiny_store["store"], {"pretrain": None, "stats": tiny_store["stats"].id})


def test_meta_id_of_another_variant_answers_the_default_methods(tiny_store, tmp_path):
    """`fedl2p personalize --meta ID` with the default --methods (which name the default run's variant) where ID is a variant other
    than the default and no default-variant artifact exists: ID's row stands for `fedl2p` (one learned row, ID's)."""
    import dataclasses
    import json
    import shutil

    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.cli.main import run_cli
    shutil.copytree(tiny_store["store"].root, tmp_path / "s")
    store = Store(tmp_path / "s")
    shutil.rmtree(store.root / "meta-train" / tiny_store["meta"].id)  # no artifact of the default variant left
    d = store.draft("meta-train", {"meta": dataclasses.asdict(old_meta(meta_grad="fomaml")), "variant": "fedl2p-fomaml"},
                    {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id})
    shutil.copy(tiny_store["meta"].file("lambda.safetensors"), d.path("lambda.safetensors"))
    d.metrics = {"variant": "fedl2p-fomaml"}
    other = d.publish()
    code = run_cli(["personalize", "--store", str(store.root), "--meta", other.id, "--epochs", "1", "--batch-size", "16",
                    "--base-lr", "0.01", "--seeds", "0", "--pretrain", tiny_store["pretrain"].id])
    assert code == 0
    art = store.newest("personalize", lambda a: a.parents.get("meta-train:fedl2p-fomaml") == other.id)
    assert json.loads(art.file("summary.json").read_text())["methods"].keys() == {"ft-bnc", "ft-bng", "ft-bni", "fedl2p-fomaml"}
