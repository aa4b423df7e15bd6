"""Issue-12 machinery: consistent client BN statistics, ft-tuned selection, input standardisation, FedAdam, the
learning history, and personalising a model on clients it was not pretrained on."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedl2p_cli import plugins
from fedl2p_cli.core.finetune import precise_bn
from fedl2p_cli.core.metanets import ServerAdam, hyperparameters, init_lambda, input_normalizer, normalize_inputs
from fedl2p_cli.core.selection import candidates, select_by_validation
from fedl2p_cli.io import results_h5
from fedl2p_cli.models.registry import build
from fedl2p_cli.stages import meta_train, partition, personalize, pipeline, stats
from fedl2p_cli.stages.common import NoProgress

from .conftest import TINY_META, TINY_PARTITION
from .helpers import detached_params, execute, handed


@torch.no_grad()
def _by_hand_statistics(model, x, beta):
    """Independent oracle: walk the small CNN's layers, at each BN take the population moments of its input and
    normalise with F.batch_norm at the beta-mixed statistics (no project code on this path)."""
    means, vars_, h, b = [], [], x, 0
    for layer in model:
        if hasattr(layer, "running_mean"):
            m = h.mean((0, 2, 3)) if h.dim() == 4 else h.mean(0)
            v = h.var((0, 2, 3), unbiased=False) if h.dim() == 4 else h.var(0, unbiased=False)
            means.append(m)
            vars_.append(v)
            mix_m = (1 - beta[b]) * layer.running_mean + beta[b] * m
            mix_v = (1 - beta[b]) * layer.running_var + beta[b] * v
            h = F.batch_norm(h, mix_m, mix_v, layer.weight, layer.bias, False, 0.0, layer.eps)
            b += 1
        else:
            h = layer(h)
    return means, vars_


@pytest.mark.parametrize("chunk", [10_000, 7])  # one full-batch pass, and the chunked pass per layer
def test_precise_bn_equals_population_statistics_under_beta(chunk):
    torch.manual_seed(0)
    model = build("small-cnn", 1, 4, catalog=plugins.current()).double().eval()
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "running_mean"):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(23, 1, 12, 12, dtype=torch.float64) * 2 + 1
    beta = torch.tensor([0.3, 0.8, 0.5], dtype=torch.float64)
    got = precise_bn(model, {k: v for k, v in detached_params(model).items()}, x, beta, chunk=chunk)
    want_m, want_v = _by_hand_statistics(model, x, beta)
    for g, w in zip(got.mean, want_m):
        assert torch.allclose(g.double(), w, atol=1e-5)
    for g, w in zip(got.var, want_v):
        assert torch.allclose(g.double(), w, rtol=1e-4, atol=1e-6)
    # layer >= 2 differs from the statistics under the pretrained normalisation (what stats.h5 holds)
    _, pt_v = _by_hand_statistics(model, x, torch.zeros(3, dtype=torch.float64))
    assert not torch.allclose(want_v[2], pt_v[2], rtol=1e-2)


def test_select_by_validation_never_looks_at_test():
    val_acc = np.array([0.5, 0.8, 0.8, 0.1])
    val_loss = np.array([1.0, 0.7, 0.6, 2.0])
    assert select_by_validation(val_acc, val_loss) == 2  # tie on accuracy -> lower loss
    assert select_by_validation(np.array([0.5, 0.5]), np.array([1.0, 1.0])) == 0


def test_ft_tuned_reports_the_validation_choice(tiny_store):
    store = tiny_store["store"]
    cfg = personalize.PersonalizeConfig(methods=["ft-bnc", "ft-bng", "ft-bni", "ft-tuned"], epochs=1, batch_size=16,
                                        base_lr=0.01, seeds=[0, 1])
    art, _ = execute(personalize, cfg, store, {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id, "meta": []})
    r = results_h5.read(art.file("results.h5"))
    cand = r.candidates
    assert cand.shape == (2, len(r.client), len(candidates()), 3)
    ti = r.methods.index("ft-tuned")
    mismatched = 0
    for k in range(2):
        for j in range(len(r.client)):
            pick = select_by_validation(cand[k, j, :, 1], cand[k, j, :, 0])
            assert r.acc_after[ti, k, j] == cand[k, j, pick, 2]
            mismatched += cand[k, j, pick, 2] < cand[k, j, :, 2].max()
    # the FT rows are the grid's base-LR candidates (same batches)
    for m in ("ft-bnc", "ft-bng", "ft-bni"):
        assert np.array_equal(r.acc_after[r.methods.index(m)], cand[:, :, candidates().index((m, 1.0)), 2])
    assert mismatched > 0, "validation and test never disagree here, so the test could not tell them apart"


def test_server_adam_first_step_is_lr_times_sign():
    lam = {"bnnet.0.weight": torch.tensor([1.0, 2.0, 3.0])}
    avg = {"bnnet.0.weight": torch.tensor([0.9, 2.0 + 1e-6, 3.5])}
    new, state = ServerAdam(0.01).step(lam, avg, {}, 1)
    assert torch.allclose(new["bnnet.0.weight"], torch.tensor([0.99, 2.01, 3.01]), atol=2e-4)  # moves with the clients
    assert set(state) == {"m.bnnet.0.weight", "v.bnnet.0.weight"}


def test_input_standardisation_is_stored_and_used_at_personalisation(tiny_store):
    store = tiny_store["store"]
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5, input_norm="standardize", meta_opt="fedadam", meta=TINY_META)
    assert cfg.variant() == "fedl2p-std-adam"
    art, _ = execute(meta_train, cfg, store, {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id})
    _, lam, norm = meta_train.load_lambda(store, art.id, plugins.current())
    assert norm is not None and not any(k.startswith("input_norm") for k in lam)
    _, table = stats.load(store, tiny_store["stats"].id)
    _, part = partition.load(store, tiny_store["partition"].id)
    seen = part.pool(False)
    rows = [table.row(c) for c in seen]
    ref = input_normalizer(table.xi[rows], table.x[rows])
    assert all(torch.equal(norm[k], ref[k]) for k in ref)
    pcfg = personalize.PersonalizeConfig(methods=["ft-bnc", "fedl2p-std-adam"], epochs=1, batch_size=16, base_lr=0.01,
                                         seeds=[0])
    pers, _ = execute(personalize, pcfg, store, {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id, "meta": [art.id]})
    r = results_h5.read(pers.file("results.h5"))
    c = int(r.client[0])
    beta, _ = hyperparameters(lam, *normalize_inputs(norm, *table.inputs(c)), len(table.param_names), 0.01, 1.0)
    assert np.allclose(r.beta["fedl2p-std-adam"][0], beta.detach().numpy(), atol=1e-6)
    raw_beta, _ = hyperparameters(lam, *table.inputs(c), len(table.param_names), 0.01, 1.0)
    assert not np.allclose(raw_beta.detach().numpy(), beta.detach().numpy(), atol=1e-6)


def test_history_shows_beta_per_domain_eta_groups_and_gradient_norms(tiny_store):
    art = tiny_store["meta"]
    with open(art.file("history.csv")) as f:
        rows = list(csv.DictReader(f))
    keys = rows[0].keys()
    for d in TINY_PARTITION["corruptions"]:
        assert f"beta_{d}_0" in keys
    assert any(k.startswith("etagroup_") for k in keys)
    for blk in ("bnnet", "lrnet", "eta"):
        assert float(rows[0][f"gnorm_{blk}"]) > 0 and 0 <= float(rows[0][f"clipped_{blk}"]) <= 1
    assert art.file("learning.png").stat().st_size > 0


def test_personalise_clients_the_model_never_saw(tmp_path):
    """[pretrain.partition] + exclude = "pretrain": stats, meta-train and personalize run on other clients, who hold
    none of the pretraining images."""
    toml = """
name = "transfer"
[partition]
dataset = "digits-c"
alpha = 0.5
clients = 6
samples_per_client = 30
unseen_fraction = 0.0
corruptions = ["clean", "invert"]
exclude = "pretrain"
[pretrain]
rounds = 1
fraction = 0.5
batch_size = 16
[pretrain.partition]
dataset = "digits"
alpha = 1000
clients = 8
samples_per_client = 40
[stats]
[[meta-train]]
rounds = 1
fraction = 0.5
epochs = 1
iterations = 1
batch_size = 16
base_lr = 0.01
[personalize]
epochs = 1
batch_size = 16
base_lr = 0.01
seeds = [0]
"""
    f = tmp_path / "t.toml"
    f.write_text(toml)
    res = pipeline.run(pipeline.load(f, tmp_path / "store"), None, NoProgress, runtime=handed())
    parts = [r.artifact for r in res if r.stage == "partition"]
    assert len(parts) == 2
    store = pipeline.Store(tmp_path / "store")
    _, pre_part = partition.load(store, parts[0].id)
    _, clients = partition.load(store, parts[1].id)
    assert not np.intersect1d(pre_part.source_index.numpy(), clients.source_index.numpy()).size
    pre = next(r.artifact for r in res if r.stage == "pretrain")
    assert pre.parents["partition"] == parts[0].id
    st = next(r.artifact for r in res if r.stage == "stats")
    assert st.parents == {"partition": parts[1].id, "pretrain": pre.id}
    assert next(r for r in res if r.stage == "personalize").artifact.parents["partition"] == parts[1].id


def test_keep_last_returns_the_final_aggregate_and_best_the_scored_broadcast(tiny_store):
    """One round: 'best' keeps the lambda the clients received (the initial one); 'last' the aggregate they sent back."""
    store = tiny_store["store"]
    got = {}
    for keep in ("best", "last"):
        cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=1, fraction=0.5, keep=keep, seed=5, meta=TINY_META)
        art, _ = execute(meta_train, cfg, store, {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id})
        got[keep] = meta_train.load_lambda(store, art.id, plugins.current())[1]
    _, table = stats.load(store, tiny_store["stats"].id)
    lam0 = init_lambda(table.xi.shape[1], table.x.shape[1], len(table.param_names), TINY_META.base_lr, "both", 5)
    assert all(torch.equal(got["best"][k], lam0[k]) for k in lam0)
    assert any(not torch.equal(got["last"][k], lam0[k]) for k in lam0)
