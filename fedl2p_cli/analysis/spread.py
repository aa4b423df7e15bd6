"""Are a learned method's strategies personal? The spread of β and η across clients and across domains.

FedL2P's claim is a strategy per client. A learned row whose β and η are the same for every client is a hand-made
recipe found by meta-learning: worth knowing, and easy to miss in a table of means. These numbers say which it is.
"""

from __future__ import annotations

import numpy as np

# Below both, every client got (nearly) one strategy: a β split of 0.05 moves a BN layer's statistics by 5% of the
# gap between the client's and the pretrained ones; an LR ratio of 1.1 is within any LR grid's step.
SAME_BETA_SPLIT = 0.05
SAME_ETA_RATIO = 1.1
# the preset under which every client starts at one strategy and the meta-nets learn a split between kinds
# (configs.PRESETS; docs/method/fedl2p.md#presets)
PERSONAL_OPTIONS = "--preset learn"


def _eta_ratio(means: np.ndarray) -> float:
    """The largest ratio between two groups' mean LR of one tensor, over the tensors whose LR is above 0 in every
    group (a frozen tensor has no ratio: `frozen` counts those)."""
    pos = means[:, (means > 0).all(axis=0)]
    if pos.shape[1] == 0 or pos.shape[0] < 2:
        return 1.0
    return float((pos.max(axis=0) / pos.min(axis=0)).max())


def frozen(eta: np.ndarray) -> int:
    """Tensors whose LR is 0 or below for at least one client: frozen (or trained by ascent) there, so left out of
    the LR ratios and counted here instead of dropped silently."""
    return int((eta <= 0).any(axis=0).sum())


def by_kind(beta: np.ndarray, eta: np.ndarray, domain: np.ndarray, names: list[str], base_lr: float) -> dict[str, float]:
    """Per kind (domain) of client, its mean β per BN layer and its mean LR multiplier (η / base LR over its clients
    and every tensor); and the split between kinds: the largest β split in a layer, the largest LR ratio of a tensor,
    the frozen tensors. What meta-train records per round (round 1 is the initial lambda: the round-0 control)."""
    out: dict[str, float] = {}
    kinds = [d for d in np.unique(domain)]
    for d in kinds:
        name = names[int(d)]
        if beta.size:
            out |= {f"beta_{name}_{i}": float(b) for i, b in enumerate(beta[domain == d].mean(0))}
        out[f"lrx_{name}"] = float(eta[domain == d].mean() / base_lr)
    if len(kinds) > 1:
        if beta.size:
            out["split_beta"] = float(np.ptp(np.stack([beta[domain == d].mean(0) for d in kinds]), axis=0).max())
        out["split_lr"] = _eta_ratio(np.stack([eta[domain == d].mean(0) for d in kinds]))
    out["frozen"] = frozen(eta)
    return out


def spread(beta: np.ndarray, eta: np.ndarray, domain: np.ndarray) -> dict[str, float]:
    """β [clients, BN layers] and η [clients, tensors] of one learned row (rows with NaN, clients it has no
    strategy for, left out): the largest SD of a layer's β across clients, the largest split of a layer's β between
    two domains' means, the largest ratio of a tensor's LR between two domains' means (and between two clients)."""
    ok = ~np.isnan(eta).any(axis=1)
    beta, eta, domain = beta[ok], eta[ok], domain[ok]
    if len(eta) == 0:
        return {}
    groups = [d for d in np.unique(domain)]
    out = {"eta_ratio_domains": _eta_ratio(np.stack([eta[domain == d].mean(0) for d in groups])),
           "eta_ratio_clients": _eta_ratio(eta), "frozen_tensors": float(frozen(eta))}
    if beta.size and not np.isnan(beta).any():
        split = _beta_split(beta, domain)
        out |= {"beta_sd_clients": float(beta.std(axis=0).max()), "beta_split_domains": split}
        if len(groups) > 1 and split > 0 and max(int((domain == d).sum()) for d in groups) > 1:
            # one client per kind: every shuffle gives the same kind means, so a p says nothing there
            out["beta_split_p"] = permutation_p(beta, domain, split)
    return out


def _beta_split(beta: np.ndarray, domain: np.ndarray) -> float:
    """The largest split of a layer's β between two domains' means."""
    return float(np.ptp(np.stack([beta[domain == d].mean(0) for d in np.unique(domain)]), axis=0).max())


PERMUTATIONS = 999


def permutation_p(beta: np.ndarray, domain: np.ndarray, split: float, n: int = PERMUTATIONS, seed: int = 0) -> float:
    """How often a split this large arises with the kind labels shuffled among the clients: (1 + count of shuffles
    whose β split reaches `split`) / (1 + n). A split the meta-nets learned by kind is rare under shuffles; one that any
    grouping of these clients shows (the inputs' geometry, a few outliers) is not. Seeded: the same p every time."""
    rng = np.random.default_rng(seed)
    hits = sum(_beta_split(beta, rng.permutation(domain)) >= split - 1e-12 for _ in range(n))
    return (1 + hits) / (1 + n)


def same_for_everyone(s: dict[str, float]) -> bool:
    """Whether the strategies are (nearly) one for every client: no β split between domains of SAME_BETA_SPLIT and no
    LR ratio between clients of SAME_ETA_RATIO (with one domain, the clients' β SD stands for the split)."""
    if not s:
        return False
    beta = max(s.get("beta_split_domains", 0.0), s.get("beta_sd_clients", 0.0))
    return beta < SAME_BETA_SPLIT and s["eta_ratio_clients"] < SAME_ETA_RATIO


def verdict(label: str, s: dict[str, float]) -> str | None:
    """One line for a learned row whose clients all got the same strategy; None when they did not."""
    if not same_for_everyone(s):
        return None
    return (f"{label}: every client got nearly the same strategy (β split between domains "
            f"{s.get('beta_split_domains', 0.0):.3f} < {SAME_BETA_SPLIT}, LR ratio between clients "
            f"{s['eta_ratio_clients']:.2f} < {SAME_ETA_RATIO}); personalize with fedl2p-checked to let each client "
            f"check the LR scale on its validation split, or meta-train with {PERSONAL_OPTIONS} (the defaults) to "
            "let the meta-nets learn a split from an equal start (docs/method/fedl2p.md#presets)")


def lines(label: str, s: dict[str, float], round0: dict[str, float] | None = None) -> list[str]:
    """What a summary prints for one learned row: its spread (beside `round0`, the same under the initial lambda:
    what training did not make), then the verdict line when there is one."""
    if not s:
        return []
    r0 = round0 or {}

    def was(key: str, fmt: str) -> str:
        return f" (round 0: {fmt.format(r0[key])})" if key in r0 else ""
    perm = f", permutation p {s['beta_split_p']:.3f}" if "beta_split_p" in s else ""
    beta = (f"β split between domains {s['beta_split_domains']:.3f}{was('beta_split_domains', '{:.3f}')} (largest in "
            f"a layer{perm}), SD across clients {s['beta_sd_clients']:.3f}; " if "beta_split_domains" in s else "")
    frozen = int(s.get("frozen_tensors", 0))
    out = [f"{label}: {beta}LR ratio between domains ×{s['eta_ratio_domains']:.2f}"
           f"{was('eta_ratio_domains', '×{:.2f}')}, between clients ×{s['eta_ratio_clients']:.2f}"
           + (f"; {frozen} tensors frozen (LR ≤ 0) for some client, left out of the ratios" if frozen else "")]
    line = verdict(label, s)
    return out + ([line] if line else [])
