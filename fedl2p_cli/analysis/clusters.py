"""Do the meta-nets' inputs and outputs cluster by domain? (Sec. 4.4, Table 6, Fig. 3/5). Pure numpy/sklearn."""

from __future__ import annotations

import numpy as np
from scipy.spatial.distance import cdist
from sklearn.cluster import SpectralClustering
from sklearn.metrics import adjusted_rand_score


def affinity(d: np.ndarray) -> np.ndarray:
    """Gaussian kernel exp(-d^2 / (2 s^2)) with s the median off-diagonal distance (scale-free)."""
    off = d[~np.eye(len(d), dtype=bool)]
    s = np.median(off[off > 0]) if (off > 0).any() else 1.0
    return np.exp(-(d ** 2) / (2 * s ** 2))


def spectral_ari(features: np.ndarray, domains: np.ndarray, seed: int = 0) -> tuple[float, np.ndarray]:
    """Spectral clustering (discretize labels, as many clusters as domains) of the clients; ARI vs domains."""
    d = cdist(features, features)
    k = len(np.unique(domains))
    labels = SpectralClustering(n_clusters=k, affinity="precomputed", assign_labels="discretize",
                                random_state=seed).fit_predict(affinity(d))
    return float(adjusted_rand_score(domains, labels)), labels


def distance_map(features: np.ndarray, domains: np.ndarray) -> np.ndarray:
    """Block (j,k) = log(d(j,k) / sqrt(d(j,j) d(k,k))), d the mean distance between clients of domains j and k
    (within a domain: over distinct pairs). The diagonal is 0 by construction."""
    ids = np.unique(domains)
    dist = cdist(features, features)
    mean = np.zeros((len(ids), len(ids)))
    for a, j in enumerate(ids):
        for b, k in enumerate(ids):
            block = dist[np.ix_(domains == j, domains == k)]
            if j == k:
                n = block.shape[0]
                mean[a, b] = block.sum() / max(n * (n - 1), 1)
            else:
                mean[a, b] = block.mean()
    diag = np.sqrt(np.outer(np.diag(mean), np.diag(mean)))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log(mean / np.maximum(diag, 1e-12))
    np.fill_diagonal(out, 0.0)
    return out
