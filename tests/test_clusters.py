import numpy as np
import pytest

from fedl2p_cli.analysis.clusters import distance_map, spectral_ari
from fedl2p_cli.errors import FedL2PError

from .helpers import execute


def blobs(k=4, per=10, sep=10.0, dim=6, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(k, dim)) * sep
    x = np.concatenate([c + rng.normal(size=(per, dim)) for c in centers])
    return x, np.repeat(np.arange(k), per)


def test_separated_domains_give_ari_1_and_positive_off_diagonal():
    x, d = blobs()
    ari, _ = spectral_ari(x, d)
    assert ari == pytest.approx(1.0)
    m = distance_map(x, d)
    assert np.allclose(np.diag(m), 0.0)
    assert (m[~np.eye(len(m), dtype=bool)] > 0).all()


def test_shuffled_labels_give_ari_near_0():
    x, d = blobs()
    rng = np.random.default_rng(1)
    aris = [spectral_ari(x, rng.permutation(d))[0] for _ in range(5)]
    assert abs(np.mean(aris)) < 0.1


def test_identical_domains_map_near_zero():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(60, 5))
    m = distance_map(x, np.repeat(np.arange(3), 20))
    assert np.abs(m).max() < 0.15


def test_analyze_stage_on_tiny_store_and_single_domain_refused(tiny_store, tmp_path):
    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.stages import analyze, meta_train, partition, personalize, pretrain, stats
    art, _ = execute(analyze, analyze.ClustersConfig(), tiny_store["store"], {"personalize": tiny_store["personalize"].id})
    assert set(art.metrics) >= {"ari_xi", "ari_x", "ari_beta", "ari_eta"}
    assert (art.path / "distance_map_beta.png").is_file()
    # a single-domain partition is refused with a clear message
    s = Store(tmp_path)
    p, _ = execute(partition, partition.PartitionConfig(dataset="digits", alpha=1.0, clients=6, samples_per_client=40,
                                                   unseen_fraction=0), s, plot=False)
    pre, _ = execute(pretrain, pretrain.PretrainConfig(rounds=1, fraction=1.0, batch_size=16), s, {"partition": p.id}, plot=False)
    st, _ = execute(stats, stats.StatsConfig(), s, {"partition": p.id, "pretrain": pre.id})
    pers, _ = execute(personalize, personalize.PersonalizeConfig(methods=["ft-bnc"], epochs=1, seeds=[0]), s,
                      {"pretrain": pre.id, "stats": st.id})
    with pytest.raises(FedL2PError, match="single domain"):
        execute(analyze, analyze.ClustersConfig(), s, {"personalize": pers.id})
    # and stats of another pretrained model are refused
    with pytest.raises(FedL2PError, match="was computed for pretrained model"):
        execute(meta_train, meta_train.MetaTrainConfig.preset("fomaml", rounds=1), tiny_store["store"],
                {"pretrain": tiny_store["pretrain"].id, "stats": _foreign_stats(tiny_store, s, st)})


def _foreign_stats(tiny_store, other_store, st):
    """Copy another store's stats artifact into the tiny store (same stage, different pretrained parent)."""
    import shutil
    dst = tiny_store["store"].root / "stats" / st.id
    if not dst.exists():
        shutil.copytree(st.path, dst)
    return st.id
