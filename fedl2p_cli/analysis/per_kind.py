"""Accuracy per kind of client (a partition's domains), beside the pool's: a learned method's pool mean can rise while
one kind of client falls below a fixed FT, and only a per-kind table shows it. Pure numpy over a personalisation's
results; `fedl2p personalize`, summary.md, the report and bench/search.py read the same dict."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

TUNED_MARGIN = 0.02  # a learned row more than 2 points below ft-tuned on a kind is named


@dataclass(frozen=True)
class Roles:
    """Which rows are which: the fixed FTs (the per-kind reference), the validation-tuned row, and the learned rows
    whose kinds are checked."""
    fixed: tuple[str, ...]
    tuned: str | None
    learned: tuple[str, ...]


def _kind_means(acc: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per seed, the mean over the kind's clients ([seeds, clients] -> [seeds]); NaN where the row has none."""
    part = acc[:, mask]
    with np.errstate(invalid="ignore"):
        return np.array([np.nan if np.isnan(row).all() else float(np.nanmean(row)) for row in part])


def _stat(per_seed: np.ndarray) -> dict[str, float] | None:
    ok = per_seed[~np.isnan(per_seed)]
    return None if ok.size == 0 else {"mean": float(ok.mean()), "sd": float(ok.std())}


def table(methods: list[str], acc_after: np.ndarray, domain: np.ndarray, names: Sequence[str] | Mapping[int, str],
          roles: Roles) -> dict:
    """Per kind: each row's accuracy (mean ± SD over seeds of the mean over the kind's clients), the best fixed FT of
    the kind, and each non-fixed row's paired Δ against it and against ft-tuned (same clients, seeds and batches;
    mean ± SD over seeds). Empty for a pool of one kind."""
    kinds = [int(d) for d in np.unique(domain)]
    if len(kinds) < 2:
        return {}
    rows: dict[str, dict[str, dict]] = {m: {} for m in methods}
    best: dict[str, str] = {}
    for d in kinds:
        kind, mask = names[d], domain == d
        per = {m: _kind_means(acc_after[i], mask) for i, m in enumerate(methods)}
        for m in methods:
            if (s := _stat(per[m])) is not None:
                rows[m][kind] = s
        fixed = [m for m in roles.fixed if kind in rows[m]]
        if fixed:
            best[kind] = max(fixed, key=lambda m: rows[m][kind]["mean"])
        for i, m in enumerate(methods):
            if m in roles.fixed or kind not in rows[m]:
                continue
            for key, ref in (("vs_best_fixed", best.get(kind)), ("vs_ft_tuned", roles.tuned)):
                if ref is not None and ref != m:
                    diff = _stat(_kind_means(acc_after[i] - acc_after[methods.index(ref)], mask))
                    if diff is not None:
                        rows[m][kind][key] = diff
    return {"kinds": [names[d] for d in kinds], "best_fixed": best, "rows": {m: v for m, v in rows.items() if v},
            "learned": [m for m in roles.learned if rows[m]], "left_behind": left_behind(rows, roles)}


def left_behind(rows: dict[str, dict[str, dict]], roles: Roles) -> dict[str, list[str]]:
    """Per learned row, the kinds it leaves below the kind's best fixed FT or more than 2 points below ft-tuned."""
    out = {}
    for m in roles.learned:
        kinds = [k for k, v in rows.get(m, {}).items()
                 if v.get("vs_best_fixed", {}).get("mean", 0.0) < 0
                 or v.get("vs_ft_tuned", {}).get("mean", 0.0) < -TUNED_MARGIN]
        if kinds:
            out[m] = kinds
    return out
