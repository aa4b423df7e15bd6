"""Which data split feeds which computation, and which defaults are on.

Split isolation: one split of every client (or every split of the unseen clients) is replaced by a canary (uniform
noise images, labels shuffled within the split) in an otherwise identical partition. Each stage is then rerun on it
with the *same* upstream artifacts, and each output must be bit-identical when it may not read that split, and must
change when it must read it:

| canary \\ output          | pretrain model | stats (seen rows) | meta λ | acc BN C/G/I, FedL2P | ft-tuned val columns | pFedLA | CAFeMe |
|--------------------------|----------------|-------------------|--------|----------------------|----------------------|--------|--------|
| seen train               | changes        | changes           | changes| changes              | changes              | changes| changes|
| seen validation          | same           | same              | changes| same                 | changes              | same   | changes|
| seen test                | same           | same              | same   | changes              | same                 | same   | same   |
| unseen (all splits)      | same           | same              | same   | same (seen pool)     | same (seen pool)     | same   | same   |

(pretrain's *history* reports the unseen clients' test accuracy, so only its model is compared; meta-train's λ reads
validation through the hypergradient's outer loss; CAFeMe's held-out loss is its validation split, pFedLA trains on
train only.) Then the same at the level of one client update, and the defaults that change results.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fedl2p_cli import methods, plugins
from fedl2p_cli.algorithms.fedl2p import MetaConfig, client_update
from fedl2p_cli.artifacts import Artifact, Store
from fedl2p_cli.core.client import ClientData
from fedl2p_cli.core.config import reference_of
from fedl2p_cli.core.finetune import ClientBN, Strategy, finetune, inference_policy, personalized_accuracy, precise_bn
from fedl2p_cli.core.metanets import init_lambda
from fedl2p_cli.core.settings import DEFAULT_META_LR
from fedl2p_cli.engine.loop import generator
from fedl2p_cli.io import partition_h5, stats_h5, weights
from fedl2p_cli.runtime import Runtime
from fedl2p_cli.stages import meta_train, partition, personalize, pfl, pretrain, stats

from .conftest import TINY_META, TINY_PRETRAIN
from .helpers import execute, tiny_client

SPLITS = {"train": 0, "val": 1, "test": 2}
CANARIES = ("seen:train", "seen:val", "seen:test", "unseen:all")

# output -> canaries under which it must change (it must stay bit-identical under the others)
READS = {
    "pretrain model": {"seen:train"},
    "stats, seen rows": {"seen:train"},
    "meta-train lambda": {"seen:train", "seen:val"},
    "accuracy of BN C/G/I and FedL2P, seen pool": {"seen:train", "seen:test"},
    "ft-tuned validation columns, seen pool": {"seen:train", "seen:val"},
    "ft-tuned choice, seen pool": set(),  # may change under train/val canaries; never under a test canary (below)
    "pfedla server": {"seen:train"},
    "cafeme omega": {"seen:train", "seen:val"},
    "accuracy, unseen pool": {"unseen:all"},
}


def canary_partition(store: Store, base: Artifact, canary: str) -> Artifact:
    """The base partition with one split of every client of a pool replaced by noise (labels shuffled within it)."""
    pool, split = canary.split(":")
    part = partition_h5.read(base.file("partition.h5"))
    g = torch.Generator().manual_seed(99)
    for c in part.pool(pool == "unseen"):
        o = part.offsets[c]
        lo, hi = (o[0], o[3]) if split == "all" else (o[SPLITS[split]], o[SPLITS[split] + 1])
        part.images[lo:hi] = torch.randint(0, 256, part.images[lo:hi].shape, generator=g, dtype=torch.uint8)
        part.labels[lo:hi] = part.labels[lo:hi][torch.randperm(hi - lo, generator=g)]
    draft = store.draft("partition", base.config | {"canary": canary}, base.parents)
    partition_h5.write(draft.path("partition.h5"), part)
    draft.metrics = dict(base.metrics)
    return draft.publish()


def outputs(store: Store, part: Artifact, pre_id: str, meta_id: str) -> dict:
    """Every output of the table, computed from partition `part` with the given upstream model and meta-nets (the
    seen pool's personalisation uses those meta-nets; pretraining, statistics, meta-training and pFL train afresh)."""
    out = {}
    pre, _ = execute(pretrain, pretrain.PretrainConfig(**TINY_PRETRAIN), store, {"partition": part.id}, plot=False)
    out["pretrain model"] = pre.file("model.safetensors").read_bytes()
    st, _ = execute(stats, stats.StatsConfig(), store, {"partition": part.id, "pretrain": pre_id})
    t = stats_h5.read(st.file("stats.h5"))
    seen = [t.row(c) for c in np.nonzero(~t.unseen)[0]]
    out["stats, seen rows"] = [t.x[seen], t.xi[seen], *[m[seen] for m in t.bn_mean], *[v[seen] for v in t.bn_var]]
    # keep = last: the aggregate after the final round (the kept "best" lambda can be round 1's, i.e. the initial one)
    meta, _ = execute(meta_train, meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5, keep="last", meta=TINY_META), store,
                      {"pretrain": pre_id, "stats": st.id})
    out["meta-train lambda"] = weights.load(meta.file("lambda.safetensors"))
    for algo, name in (("pfedla", "server.safetensors"), ("cafeme", "omega.safetensors")):
        a, _ = execute(pfl, pfl.PFLConfig(algo=algo, rounds=2, fraction=0.5, local_epochs=1, batch_size=16, lr=0.02,
                                     eval_every=1), store, {"partition": part.id})
        out[f"{algo} {name.split('.')[0]}"] = weights.load(a.file(name))
    for unseen in (False, True):
        cfg = personalize.PersonalizeConfig(unseen=unseen, methods=["ft-bnc", "ft-bng", "ft-bni", "ft-tuned"], epochs=1,
                                            batch_size=16, base_lr=0.01, seeds=[0])
        art, _ = execute(personalize, cfg, store, {"pretrain": pre_id, "stats": st.id, "meta": [meta_id]})
        _, r = personalize.load(store, art.id)
        if unseen:
            out["accuracy, unseen pool"] = r.acc_after
            continue
        fixed = [i for i, m in enumerate(r.methods) if m != "ft-tuned"]
        out["accuracy of BN C/G/I and FedL2P, seen pool"] = r.acc_after[fixed]
        out["ft-tuned validation columns, seen pool"] = r.candidates[..., :2]
        out["ft-tuned choice, seen pool"] = np.array([[np.lexsort((np.arange(len(v)), v[:, 0], -v[:, 1]))[0]
                                                        for v in seed] for seed in r.candidates])
    return out


def same(a, b) -> bool:
    if isinstance(a, bytes):
        return a == b
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return np.array_equal(a, b, equal_nan=True)


@pytest.fixture(scope="module")
def isolation(tiny_store, tmp_path_factory):
    """The table's outputs for the base partition and each canary, in a copy of the tiny store (every run reuses
    what it can)."""
    import shutil
    root = tmp_path_factory.mktemp("wiring") / "store"
    shutil.copytree(tiny_store["store"].root, root)
    store, base_part = Store(root), tiny_store["partition"]
    pre, meta = tiny_store["pretrain"].id, tiny_store["meta"].id
    base = outputs(store, base_part, pre, meta)
    return base, {c: outputs(store, canary_partition(store, store.load("partition", base_part.id), c), pre, meta)
                  for c in CANARIES}


@pytest.mark.parametrize("output", list(READS))
def test_each_output_reads_exactly_its_splits(isolation, output):
    base, canaried = isolation
    for canary, got in canaried.items():
        changed = not same(base[output], got[output])
        if output == "ft-tuned choice, seen pool":
            assert not (canary == "seen:test" and changed), "ft-tuned's choice saw the test split"
            continue
        want = canary in READS[output]
        assert changed == want, f"{output}: a {canary} canary {'changed' if changed else 'left unchanged'} it"


# -- one client update ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def one_client(tiny_store):
    model, theta, lam, inputs, bn, part, c = tiny_client(tiny_store)
    return model, theta, lam, inputs, bn, part.client(c)


def with_canary(data: ClientData, split: str) -> ClientData:
    g = torch.Generator().manual_seed(7)
    x, y = getattr(data, split)
    return dataclasses.replace(data, **{split: (torch.randn(x.shape, generator=g), y[torch.randperm(len(y), generator=g)])})


@pytest.mark.parametrize("variant", ["ift", "fomaml", "ift-last-step"])
def test_a_meta_client_update_reads_train_and_validation_never_test(one_client, variant):
    """The fine-tuning (inner loop) reads train, the hypergradient's outer loss reads validation: a canary in either
    moves lambda; a test canary leaves every output bit-identical."""
    model, theta, lam, (xi, x), bn, data = one_client
    cfg = dataclasses.replace(TINY_META, meta_grad="fomaml" if variant == "fomaml" else "ift",
                              ift_at="last-step" if variant == "ift-last-step" else "star")

    def run(d):
        return client_update(model, theta, lam, xi, x, bn, d, cfg, torch.Generator().manual_seed(0))

    base = run(data)
    for split, reads in (("train", True), ("val", True), ("test", False)):
        r = run(with_canary(data, split))
        moved = any(not torch.equal(r.lam[k], base.lam[k]) for k in lam)
        assert moved == reads, f"{split} canary {'moved' if moved else 'did not move'} lambda"
        assert (r.val_loss != base.val_loss) == reads, split


def test_a_flower_site_computes_its_statistics_from_its_own_training_split(one_client, monkeypatch, tmp_path):
    from fedl2p_cli.flower import app as flower_app
    model, theta, lam, _, _, data = one_client
    flower_app.export_site(data, 3, tmp_path / "site")
    folder = tmp_path / "site"
    seen = []
    real = flower_app.client_stats
    monkeypatch.setattr(flower_app, "client_stats", lambda m, x: seen.append(x.clone()) or real(m, x))
    spec = {"model": "small-cnn", "in_channels": data.train[0].shape[1], "num_classes": 10, "seed": 0}
    cfg = dataclasses.asdict(meta_train.MetaTrainConfig.preset("fomaml", rounds=1, meta=TINY_META))
    state = {k: v for k, v in model.state_dict().items()}
    reply = flower_app.site_update(str(folder), spec, state, lam, 0, cfg, Runtime())
    assert reply.diverged is None and reply.result is not None and len(seen) == 1 and torch.equal(seen[0], data.train[0])


# -- the defaults that change results --------------------------------------------------------------------------------

DEFAULTS = [  # (config, field, default, where it is documented)
    (MetaConfig, "iterations", 3, "K: DESIGN.md §3 (the authors' CIFAR-10 config, outer_loop_epochs 3)"),
    (MetaConfig, "q", 3, "Q: Alg. 2; DESIGN.md §3"),
    (MetaConfig, "psi", 0.1, "psi: Alg. 2; DESIGN.md §3"),
    (MetaConfig, "scale_by_psi", True, "p scaled by psi so the converged series approximates H^-1 v; docs/method/fedl2p.md"),
    (MetaConfig, "psi_power", 3, "psi = min(psi, 0.5/lambda_max), lambda_max from the series' Krylov space; docs/explanation/ift.md"),
    (MetaConfig, "eta_bound", 10.0, "eta~ within [base LR / 10, x 10] under the IFT; docs/method/fedl2p.md"),
    (MetaConfig, "meta_grad", "fomaml", "FOMAML+ (App. F), ahead of the paper's IFT in more bench cells; docs/method/fedl2p.md"),
    (MetaConfig, "hessian", "fo", "meta-train --hessian help; README 'meta-train'"),
    (MetaConfig, "batch_size", 32, "paper: batch 32; DESIGN.md §3"),
    (MetaConfig, "lr_bnnet", 0.01, "the learn preset (App. E: 1e-3); docs/method/fedl2p.md#the-log-head"),
    (MetaConfig, "lr_lrnet", 0.01, "the learn preset (App. E: 1e-3); docs/method/fedl2p.md#the-log-head"),
    (MetaConfig, "lr_eta", 1e-4, "DESIGN.md §3"),
    (MetaConfig, "client_bn", "precise", "PreciseBN client statistics: DESIGN.md §3 'consistent statistics'"),
    (MetaConfig, "hidden_bias", "paper", "App. E: every meta-net bias is the constant; DESIGN.md §3"),
    (MetaConfig, "beta_init", 0.5, "App. E's 0.5, the learn preset's (--preset fomaml: 0.9); docs/method/fedl2p.md"),
    (MetaConfig, "head", "log", "the learn preset: every client starts equal; docs/method/fedl2p.md#presets"),
    (MetaConfig, "lr_grad", "trajectory-bn", "the learn preset; docs/method/fedl2p.md#the-log-head"),
    (MetaConfig, "meta_signal", "loss", "the paper's dL_V/dlambda; docs/method/fedl2p.md#meta-signal"),
    (MetaConfig, "init_gain", 0.1, "App. E: Xavier gain 0.1"),
    (MetaConfig, "ift_at", "star", "meta-train --ift-at help"), (MetaConfig, "val_stats", "running", "the paper's Eq. 2"),
    (MetaConfig, "eta_nonneg", False, "eta~ unconstrained as in the authors' code; meta-train --eta-nonneg help"),
    (MetaConfig, "beta_output", "ste-clamp", "App. E: clamp with a straight-through estimator; --beta-output help"),
    (meta_train.MetaTrainConfig, "keep", "last", "the learn preset (Alg. 1 keeps the lowest validation loss: best)"),
    (meta_train.MetaTrainConfig, "meta_opt", "fedavg", "Alg. 1: FedAvg of lambda"),
    (meta_train.MetaTrainConfig, "input_norm", "robust", "the learn preset (the paper feeds raw statistics: none)"),
    (meta_train.MetaTrainConfig, "client_weights", "equal", "the learn preset (the paper: samples)"),
    (personalize.PersonalizeConfig, "client_bn", "precise", "personalize --client-bn help; DESIGN.md §3"),
    (personalize.PersonalizeConfig, "eval_stats", "running", "the paper's inference; personalize --eval-stats help"),
]


# defaults that moved away from the paper: ids and variant names stay measured against the paper's value
REFERENCES = [(MetaConfig, "meta_grad", "ift"), (MetaConfig, "beta_init", 0.5), (MetaConfig, "head", "paper"),
              (MetaConfig, "lr_grad", "last-step"), (MetaConfig, "lr_bnnet", 1e-3), (MetaConfig, "lr_lrnet", 1e-3),
              (meta_train.MetaTrainConfig, "keep", "best"), (meta_train.MetaTrainConfig, "input_norm", "none"),
              (meta_train.MetaTrainConfig, "client_weights", "samples")]


@pytest.mark.parametrize("cls,name,value", REFERENCES, ids=[f"{c.__name__}.{n}" for c, n, _ in REFERENCES])
def test_a_moved_default_keeps_the_papers_value_as_its_reference(cls, name, value):
    assert reference_of({f.name: f for f in dataclasses.fields(cls)}[name]) == value


@pytest.mark.parametrize("cls,name,value,where", DEFAULTS, ids=[f"{c.__name__}.{n}" for c, n, _, _ in DEFAULTS])
def test_defaults_that_change_results_are_pinned(cls, name, value, where):
    got = {f.name: f for f in dataclasses.fields(cls)}[name]
    default = got.default_factory() if got.default is dataclasses.MISSING else got.default
    assert default == value, f"{cls.__name__}.{name} default is {default!r}, documented as {value!r} in: {where}"
    assert DEFAULT_META_LR == {"bnnet": 1e-3, "lrnet": 1e-3, "eta": 1e-4}


def test_the_paper_meta_net_init_is_the_default():
    """App. E: every bias the constant (0.5 BNNet, 1.0 LRNet), weights small, eta~ = the base LR."""
    lam = init_lambda(4, 6, 5, 0.01, "both", 0)
    for k, v in lam.items():
        if k.endswith("bias"):
            assert torch.all(v == (0.5 if k.startswith("bnnet") else 1.0)), k
    assert torch.all(lam["eta"] == 0.01) and lam["bnnet.0.weight"].abs().max() < 0.1


def test_each_ft_baseline_has_its_bn_policy():
    """FT (BN C): beta 1; FT (BN G): beta 0; FT (BN I): batch statistics in training and at test time."""
    s = {m: methods.get(m, plugins.current()).fixed(1.0, 0.01, 3, 4) for m in methods.baselines(plugins.current())}
    assert torch.equal(s["ft-bnc"].beta, torch.ones(3)) and torch.equal(s["ft-bng"].beta, torch.zeros(3))
    assert s["ft-bni"].beta is None and inference_policy(None, ClientBN([], [])).client_mean is None
    assert all(torch.equal(v.lr, torch.full((4,), 0.01)) for v in s.values())


def test_fine_tuning_recomputes_client_statistics_by_default(one_client):
    """PreciseBN is on by default: after fine-tuning, the client's statistics are those of one pass under the
    fine-tuned weights (not the momentum running statistics)."""
    model, theta, _, _, bn, data = one_client
    s = Strategy(torch.full((len(bn.mean),), 0.7), torch.full((len(theta),), 0.01))
    ft = finetune(model, theta, *data.train, s, bn, 2, 16, torch.Generator().manual_seed(0))
    want = precise_bn(model, ft.params, data.train[0], s.beta)
    assert all(torch.equal(a, b) for a, b in zip(ft.bn.mean + ft.bn.var, want.mean + want.var))
    stale = finetune(model, theta, *data.train, s, bn, 2, 16, torch.Generator().manual_seed(0), client_bn="running")
    assert not torch.equal(stale.bn.mean[1], want.mean[1])


def test_personalize_reports_an_accuracy_recomputed_from_primitives(tiny_store):
    """One client's FT (BN C) row in results.h5, recomputed here: fine-tune on train with the seed's batches,
    PreciseBN statistics, accuracy on the test split. A different split, a stale-statistics default or another
    batch order would not reproduce it."""
    store = tiny_store["store"]
    art = tiny_store["personalize"]
    _, r = personalize.load(store, art.id)
    _, part = partition.load(store, tiny_store["partition"].id)
    _, model, state = pretrain.load(store, tiny_store["pretrain"].id, plugins.current())
    _, table = stats.load(store, tiny_store["stats"].id)
    model.eval()
    theta = {n: state[n] for n, _ in model.named_parameters()}
    j = 1
    c, seed = int(r.client[j]), r.seeds[0]
    train, test = part.client(c).train, part.client(c).test
    s = Strategy(torch.ones(table.xi.shape[1]), torch.full((len(theta),), art.config["base_lr"]))
    ft = finetune(model, theta, *train, s, table.client_bn(c), art.config["epochs"], art.config["batch_size"],
                  generator(seed, c, 7), client_bn="precise")
    want = personalized_accuracy(model, ft.params, *test, s, ft.bn, art.config["batch_size"])[1]
    assert r.acc_after[r.methods.index("ft-bnc"), 0, j] == want


def test_every_config_is_keyword_only():
    """A config built from positional arguments silently swaps values when a field is added or moved; every
    config dataclass refuses them."""
    import dataclasses

    import pytest

    from fedl2p_cli.algorithms import cafeme, fedl2p, local
    from fedl2p_cli.stages import analyze, meta_train, partition, personalize, pfl, pretrain, stats
    classes = [partition.PartitionConfig, pretrain.PretrainConfig, stats.StatsConfig, meta_train.MetaTrainConfig,
               fedl2p.MetaConfig, personalize.PersonalizeConfig, pfl.PFLConfig, analyze.ClustersConfig,
               local.LocalConfig, cafeme.CAFeMeConfig]
    for cls in classes:
        first = dataclasses.fields(cls)[0]
        with pytest.raises(TypeError):
            cls(getattr(cls(), first.name))
