"""What a client's own check picked: `fedl2p-checked`'s LR factor and `ft-tuned`'s recipe, counted per kind of client.

With a learned LR scale a checked row's picks should sit at x1; `ft-tuned` picking its grid's largest LR often says
the grid is too narrow there, so every Δ against it is read with that count beside it.
"""

from __future__ import annotations

import numpy as np

from ..core.selection import LR_FACTORS, candidates, select_by_validation


def _picked(trials: np.ndarray) -> np.ndarray:
    """[S, C, K, 3] (val loss, val acc, test acc) -> the index each (seed, client) picked on validation, [S, C]."""
    s, c = trials.shape[:2]
    out = np.full((s, c), -1)
    for i in range(s):
        for j in range(c):
            t = trials[i, j]
            if not np.isnan(t[:, :2]).any():
                out[i, j] = select_by_validation(t[:, 1], t[:, 0])
    return out


def _counts(labels: list[str], picked: np.ndarray, domain: np.ndarray, names: list[str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for d in np.unique(domain):
        got = picked[:, domain == d].ravel()
        out[names[int(d)]] = {lab: int((got == i).sum()) for i, lab in enumerate(labels) if (got == i).any()}
    return out


def checked(trials: np.ndarray, domain: np.ndarray, names: list[str], factors: tuple[float, ...] = LR_FACTORS
            ) -> dict[str, dict[str, int]]:
    """A checked row's picks per kind: how many (seed, client) pairs kept the learned LRs x each factor, or none."""
    return _counts([f"×{f:g}" for f in factors] + ["none"], _picked(trials), domain, names)


def tuned_edge(cands: np.ndarray, domain: np.ndarray, names: list[str]) -> dict[str, float]:
    """ft-tuned's share of (seed, client) pairs per kind that picked a recipe at its grid's largest LR, and overall."""
    edge = [i for i, (_, f) in enumerate(candidates()) if f == max(LR_FACTORS)]
    picked = _picked(cands)
    at = np.isin(picked, edge)
    out = {names[int(d)]: float(at[:, domain == d].mean()) for d in np.unique(domain)}
    return out | {"all": float(at.mean())}
