"""Dirichlet (LDA) label skew with equal client sizes, domains and seen/unseen pools. Pure numpy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import FedL2PError

SPLITS = ("train", "val", "test")


@dataclass
class ClientSplit:
    """One client's sample indices (into the source pool) per split, and its domain."""

    domain: int
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray

    def indices(self) -> np.ndarray:
        return np.concatenate([self.train, self.val, self.test])


def draw_label_mix(rng: np.random.Generator, by_class: list[list[int]], alpha: float, n: int) -> list[int]:
    """Take `n` indices following p ~ Dir(alpha); classes that run out are renormalised away."""
    k = len(by_class)
    p = rng.dirichlet(np.full(k, alpha))
    taken: list[int] = []
    need = n
    while need > 0:
        avail = np.array([len(c) > 0 for c in by_class])
        if not avail.any():
            raise FedL2PError("the data pool ran out while partitioning; lower --clients or --samples-per-client")
        q = p * avail
        q = q / q.sum() if q.sum() > 0 else avail / avail.sum()
        counts = rng.multinomial(need, q)
        for c in np.nonzero(counts)[0]:
            m = min(int(counts[c]), len(by_class[c]))
            taken += by_class[c][:m]
            del by_class[c][:m]
            need -= m
    return taken


def split_client(rng: np.random.Generator, idx: list[int] | np.ndarray, val_fraction: float, test_fraction: float,
                 domain: int) -> ClientSplit:
    idx = rng.permutation(np.asarray(idx, dtype=np.int64))
    n_test = int(round(len(idx) * test_fraction))
    n_val = int(round((len(idx) - n_test) * val_fraction))
    test, val, train = idx[:n_test], idx[n_test:n_test + n_val], idx[n_test + n_val:]
    return ClientSplit(domain, np.sort(train), np.sort(val), np.sort(test))


def per_pool(value, n: int) -> list:
    """One value for every pool, or a list with one per pool (the per-domain options)."""
    return list(value) if isinstance(value, (list, tuple)) else [value] * n


def dirichlet_partition(labels: np.ndarray, pools: list[np.ndarray], clients_per_pool: list[int], samples: int | list[int],
                        alpha: float | list[float], val_fraction: float, test_fraction: float, seed: int) -> list[ClientSplit]:
    """Each pool (a domain) is split among its clients by Dir(alpha); every client gets `samples` indices (both may
    be given per pool)."""
    alphas, sizes = per_pool(alpha, len(pools)), per_pool(samples, len(pools))
    if min(alphas) <= 0:
        raise FedL2PError(f"--alpha must be > 0 (large values such as 1000 are ~IID), got {min(alphas)}")
    if min(sizes) < 3:
        raise FedL2PError(f"--samples-per-client must be at least 3, got {min(sizes)}")
    if not 0 <= val_fraction < 1 or not 0 < test_fraction < 1:
        raise FedL2PError("--val-fraction must be in [0,1) and --test-fraction in (0,1)")
    rng = np.random.default_rng(seed)
    k = int(labels.max()) + 1
    out: list[ClientSplit] = []
    for d, (pool, n_clients, n_samples, a) in enumerate(zip(pools, clients_per_pool, sizes, alphas)):
        if n_clients * n_samples > len(pool):
            raise FedL2PError(f"domain {d} holds {len(pool)} samples but {n_clients} clients x {n_samples} samples "
                              f"= {n_clients * n_samples} were asked for; lower --clients or --samples-per-client")
        pool = rng.permutation(pool)
        by_class = [list(pool[labels[pool] == c]) for c in range(k)]
        for _ in range(n_clients):
            out.append(split_client(rng, draw_label_mix(rng, by_class, a, n_samples), val_fraction, test_fraction, d))
    return out


def shards_partition(labels: np.ndarray, pools: list[np.ndarray], clients_per_pool: list[int], samples: int | list[int],
                     classes_per_client: int, val_fraction: float, test_fraction: float, seed: int) -> list[ClientSplit]:
    """Shards (pFedLA's non-IID.1, CAFeMe's shards): every client holds `classes_per_client` distinct classes in
    equal amounts (the remainder of samples / classes goes one each to its first classes). Classes are drawn
    at random among those with enough samples left, so every client gets exactly `samples`."""
    if not 0 <= val_fraction < 1 or not 0 < test_fraction < 1:
        raise FedL2PError("--val-fraction must be in [0,1) and --test-fraction in (0,1)")
    k = int(labels.max()) + 1
    if not 1 <= classes_per_client <= k:
        raise FedL2PError(f"--shard-classes must be in 1..{k}, got {classes_per_client}")
    sizes = per_pool(samples, len(pools))
    if min(sizes) < classes_per_client:
        raise FedL2PError(f"--samples-per-client ({min(sizes)}) must be at least --shard-classes ({classes_per_client})")
    rng = np.random.default_rng(seed)
    out: list[ClientSplit] = []
    for d, (pool, n_clients, n_samples) in enumerate(zip(pools, clients_per_pool, sizes)):
        pool = rng.permutation(pool)
        by_class = [list(pool[labels[pool] == c]) for c in range(k)]
        for _ in range(n_clients):
            need = [n_samples // classes_per_client + (i < n_samples % classes_per_client) for i in range(classes_per_client)]
            avail = np.array([len(c) >= need[0] for c in by_class])
            if avail.sum() < classes_per_client:
                raise FedL2PError(f"domain {d} ran out of classes with {need[0]} samples left while making shards; "
                                  "lower --clients or --samples-per-client")
            chosen = rng.choice(np.nonzero(avail)[0], size=classes_per_client, replace=False)
            taken: list[int] = []
            for c, m in zip(chosen, need):
                taken += by_class[c][:m]
                del by_class[c][:m]
            out.append(split_client(rng, taken, val_fraction, test_fraction, d))
    return out


def choose_unseen(domains: np.ndarray, fraction: float, unseen_domains: list[int], seed: int) -> np.ndarray:
    """Flags unseen clients: `fraction` of each domain (at least one if fraction > 0), plus whole domains."""
    if not 0 <= fraction < 1:
        raise FedL2PError(f"--unseen-fraction must be in [0,1), got {fraction}")
    rng = np.random.default_rng(seed + 7919)
    unseen = np.isin(domains, unseen_domains)
    for d in np.unique(domains):
        members = np.nonzero((domains == d) & ~unseen)[0]
        if len(members) < 2:  # an all-unseen domain, or one client that must stay seen
            continue
        n = int(round(len(members) * fraction)) if fraction > 0 else 0
        n = max(n, 1) if fraction > 0 and len(members) > 1 else n
        unseen[rng.choice(members, size=min(n, len(members) - 1), replace=False)] = True
    if unseen.all():
        raise FedL2PError("no seen clients are left; lower --unseen-fraction or name fewer --unseen-domains")
    return unseen


def label_entropy(hist: np.ndarray) -> np.ndarray:
    """Shannon entropy (nats) of each row of a label histogram."""
    p = hist / np.maximum(hist.sum(axis=1, keepdims=True), 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.nansum(np.where(p > 0, p * np.log(p), 0.0), axis=1)
