import numpy as np
import pytest
import torch

from fedl2p_cli import plugins
from fedl2p_cli.data.datasets import Dataset
from fedl2p_cli.data.partition import choose_unseen, dirichlet_partition, label_entropy
from fedl2p_cli.errors import FedL2PError
from fedl2p_cli.stages.partition import PartitionConfig, build_partition

CATALOG = plugins.build()  # the built-ins: the sources a partition is drawn from


def synthetic(n=6000, k=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Dataset("syn", torch.randint(0, 80, (n, 1, 8, 8), generator=g, dtype=torch.uint8),
                   torch.arange(n) % k, [str(i) for i in range(k)], (0.5,), (0.25,))


def entropy_for(alpha):
    ds = synthetic()
    p = build_partition(PartitionConfig(dataset="digits", alpha=alpha, clients=50, samples_per_client=100, unseen_fraction=0), ds,
                        catalog=CATALOG)
    return label_entropy(p.label_hist).mean()


def test_label_mix_concentrates_as_alpha_shrinks():
    e_iid, e_1, e_01 = entropy_for(1000), entropy_for(1.0), entropy_for(0.1)
    assert e_iid > 2.2 > e_1 > e_01  # max is log(10) = 2.30
    assert e_01 < 0.5 * e_iid


def test_equal_sizes_no_reuse_and_splits():
    labels = np.arange(5000) % 10
    splits = dirichlet_partition(labels, [np.arange(5000)], [40], 100, 0.3, 0.2, 0.2, seed=1)
    all_idx = np.concatenate([s.indices() for s in splits])
    assert all(len(s.indices()) == 100 for s in splits)
    assert len(np.unique(all_idx)) == len(all_idx)  # no sample used twice
    assert all(len(s.test) == 20 and len(s.val) == 16 and len(s.train) == 64 for s in splits)


def test_val_and_test_follow_the_clients_label_mix():
    labels = np.arange(20000) % 10
    splits = dirichlet_partition(labels, [np.arange(20000)], [20], 500, 0.2, 0.2, 0.2, seed=2)
    for s in splits:
        tr = np.bincount(labels[s.train], minlength=10) / len(s.train)
        te = np.bincount(labels[s.test], minlength=10) / len(s.test)
        assert np.abs(tr - te).sum() < 0.4


def test_same_seed_same_partition_and_different_seed_differs():
    ds = synthetic()
    cfg = PartitionConfig(dataset="digits", alpha=0.5, clients=20, samples_per_client=50, seed=3)
    a, b = build_partition(cfg, ds, catalog=CATALOG), build_partition(cfg, ds, catalog=CATALOG)
    assert torch.equal(a.source_index, b.source_index) and np.array_equal(a.unseen, b.unseen)
    c = build_partition(PartitionConfig(dataset="digits", alpha=0.5, clients=20, samples_per_client=50, seed=4), ds, catalog=CATALOG)
    assert not torch.equal(a.source_index, c.source_index)


def test_generated_domains_are_disjoint_and_shifted():
    ds = synthetic()
    cfg = PartitionConfig(dataset="digits-c", alpha=1.0, clients=12, samples_per_client=60, corruptions=["clean", "invert", "contrast"])
    p = build_partition(cfg, ds, catalog=CATALOG)
    src = p.source_index.numpy()
    assert len(np.unique(src)) == len(src)  # domains draw from disjoint pools
    dom_of_sample = np.repeat(p.domain, 60)
    means = [p.images[torch.from_numpy(dom_of_sample == d)].float().mean().item() for d in range(3)]
    assert abs(means[0] - means[1]) > 5  # invert moves the pixel mean
    stds = [p.images[torch.from_numpy(dom_of_sample == d)].float().std().item() for d in range(3)]
    assert stds[2] < 0.8 * stds[0]  # contrast shrinks the spread


def test_unseen_pools_per_domain_and_whole_domains():
    dom = np.repeat(np.arange(4), 10)
    u = choose_unseen(dom, 0.2, [], seed=0)
    assert all(u[dom == d].sum() == 2 for d in range(4))
    u2 = choose_unseen(dom, 0.0, [3], seed=0)
    assert u2[dom == 3].all() and not u2[dom != 3].any()


@pytest.mark.parametrize("kw", [dict(alpha=0), dict(alpha=-1), dict(clients=1000, samples_per_client=100)])
def test_bad_input(kw):
    with pytest.raises(FedL2PError):
        build_partition(PartitionConfig(dataset="digits", **({"clients": 10, "samples_per_client": 50} | kw)), synthetic(), catalog=CATALOG)


def test_per_domain_options_give_each_domain_its_own_skew_size_and_shift():
    """--domain-alpha, --domain-samples and --domain-severity: the named domains' clients get their own label skew,
    sample count and corruption level; every other domain is exactly what the global options give."""
    ds = synthetic(n=9000)
    common = dict(dataset="digits-c", corruptions=["clean", "contrast", "invert"], clients=30, alpha=1000.0,
                  samples_per_client=90, unseen_fraction=0.0, severity=3)
    p = build_partition(PartitionConfig(**common, domain_alpha={"clean": 0.05}, domain_samples={"clean": 40},
                                        domain_severity={"contrast": 5}), ds, catalog=CATALOG)
    sizes = p.offsets[:, 3] - p.offsets[:, 0]
    dom = {n: p.domain == d for d, n in enumerate(p.domain_names)}
    assert set(sizes[dom["clean"]]) == {40} and set(sizes[~dom["clean"]]) == {90}
    ent = label_entropy(p.label_hist)
    assert ent[dom["clean"]].mean() < 0.6 < 2.0 < ent[~dom["clean"]].mean()  # Dir(0.05): ~one class; Dir(1000): all ten
    from fedl2p_cli.data import corruptions as corr
    for d, name in enumerate(p.domain_names):  # each domain's pixels: its corruption at its own severity
        rows = np.concatenate([np.arange(p.offsets[c, 0], p.offsets[c, 3]) for c in np.nonzero(p.domain == d)[0]])
        level = 5 if name == "contrast" else 3
        want = corr.apply(name, ds.images[p.source_index[rows]], level, d)  # seed 0 * 1000 + d, as the stage draws it
        assert torch.equal(p.images[rows], want), name
        assert not torch.equal(corr.apply(name, ds.images[p.source_index[rows]], 3 if level == 5 else 5, d), want) or \
            name in ("clean", "invert"), name  # the level matters for contrast (so the check can fail)


def test_per_domain_options_at_their_defaults_keep_every_partition_id():
    from fedl2p_cli.stages.common import config_dict
    d = config_dict(PartitionConfig(dataset="digits-c"))
    assert not {"domain_alpha", "domain_samples", "domain_severity"} & set(d)
    assert "domain_alpha" in config_dict(PartitionConfig(dataset="digits-c", domain_alpha={"clean": 1.0}))


def test_generated_domains_are_normalised_as_the_source_so_the_clean_domain_is_the_pretraining_data():
    """A model pretrained on the plain dataset sees a generated partition's clean domain exactly as its own data:
    the same constants, so the same normalised pixels for the same source image (the planted cell's clean clients got
    13.7% from their global model under the partition's own constants, 72.2% under the source's). The corruptions are
    then each domain's shift alone."""
    from fedl2p_cli.data.datasets import channel_stats, normalize
    ds = synthetic()
    cfg = dict(dataset="digits-c", alpha=1.0, clients=12, samples_per_client=60, corruptions=["clean", "invert"])
    p = build_partition(PartitionConfig(**cfg), ds, catalog=CATALOG)
    assert p.mean == ds.mean and p.std == ds.std
    plain = build_partition(PartitionConfig(dataset="digits", alpha=1.0, clients=6, samples_per_client=60), ds, catalog=CATALOG)
    clean = next(c for c in range(12) if p.domain[c] == 0)
    x, src = p.client(clean).train[0], p.source_index[p.offsets[clean][0]:p.offsets[clean][1]]
    common = np.intersect1d(src.numpy(), plain.source_index.numpy())
    row = lambda q, i: q.images[int(np.nonzero(q.source_index.numpy() == i)[0][0])].float()  # noqa: E731
    for i in common[:5]:  # the same source image: the same raw pixels and the same constants in both partitions
        assert torch.equal(row(p, i), row(plain, i))
    assert torch.equal(x[:1], normalize(p.images[p.offsets[clean][0]:p.offsets[clean][0] + 1], ds.mean, ds.std))
    old = build_partition(PartitionConfig(**cfg, normalize="partition"), ds, catalog=CATALOG)  # the older behaviour, on request
    assert (old.mean, old.std) == channel_stats(old.images) and old.mean != ds.mean


def test_normalize_is_in_the_id_only_where_it_changes_the_pixels():
    from fedl2p_cli.artifacts import artifact_id
    from fedl2p_cli.stages.common import config_dict
    from fedl2p_cli.stages.partition import generates
    gen, plain = PartitionConfig(dataset="digits-c"), PartitionConfig(dataset="digits")
    assert generates(gen, CATALOG) and not generates(plain, CATALOG)
    assert "normalize" in config_dict(gen)  # a stage that leaves it out (non-generated, or "partition") says so
    old = {k: v for k, v in config_dict(PartitionConfig(dataset="digits-c", normalize="partition")).items() if k != "normalize"}
    assert artifact_id("partition", old, {}) != artifact_id("partition", config_dict(gen), {})
