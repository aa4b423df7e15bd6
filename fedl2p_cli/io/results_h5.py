"""`results.h5` of `fedl2p personalize`.

Layout (plain h5py):
  attrs: methods (JSON list), seeds (JSON list), pool ("seen"|"unseen"), epochs, base_lr, client_bn,
         eval_stats (absent from files written before that option existed)
  /client      int64   [C]
  /domain      int64   [C]
  /acc_before  float64 [C]            the global model, pretrained BN statistics
  /acc_after   float64 [M, S, C]      method m, seed s, client c (NaN where a method has no lambda for c)
  /beta/<m>    float32 [C, B]         beta used (NaN rows for BN I)
  /eta/<m>     float32 [C, |P|]       per-tensor learning rate used
  /sparsity/<m> float64 [C]           share of parameters (elements) whose learning rate is 0
  /candidates  float64 [S, C, K, 3]   only with ft-tuned: per seed, client and candidate recipe
                                      (core.selection.candidates() order) its val loss, val accuracy, test accuracy
  /checked/<m> float64 [S, C, F+1, 3] a checked row's trials: its LR factors in order, then no fine-tuning; the same
                                      three scores (absent from files written before checked rows recorded them)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np


@dataclass
class Results:
    methods: list[str]
    seeds: list[int]
    pool: str
    client: np.ndarray
    domain: np.ndarray
    acc_before: np.ndarray
    acc_after: np.ndarray
    beta: dict[str, np.ndarray]
    eta: dict[str, np.ndarray]
    sparsity: dict[str, np.ndarray]
    attrs: dict
    candidates: np.ndarray | None = None
    checked: dict[str, np.ndarray] = field(default_factory=dict)  # a checked row's trials [S, C, F+1, 3]


def write(path: Path, r: Results) -> None:
    with h5py.File(path, "w") as f:
        f.attrs["methods"], f.attrs["seeds"], f.attrs["pool"] = json.dumps(r.methods), json.dumps(r.seeds), r.pool
        for k, v in r.attrs.items():
            f.attrs[k] = v
        f["client"], f["domain"], f["acc_before"], f["acc_after"] = r.client, r.domain, r.acc_before, r.acc_after
        for m in r.methods:
            f[f"beta/{m}"], f[f"eta/{m}"], f[f"sparsity/{m}"] = r.beta[m], r.eta[m], r.sparsity[m]
        if r.candidates is not None:
            f["candidates"] = r.candidates
        for m, v in r.checked.items():
            f[f"checked/{m}"] = v


def read(path: Path) -> Results:
    with h5py.File(path, "r") as f:
        methods = json.loads(f.attrs["methods"])
        return Results(methods, json.loads(f.attrs["seeds"]), str(f.attrs["pool"]), f["client"][...], f["domain"][...],
                       f["acc_before"][...], f["acc_after"][...], {m: f[f"beta/{m}"][...] for m in methods},
                       {m: f[f"eta/{m}"][...] for m in methods}, {m: f[f"sparsity/{m}"][...] for m in methods},
                       {k: f.attrs[k] for k in f.attrs if k not in ("methods", "seeds", "pool")},
                       f["candidates"][...] if "candidates" in f else None,
                       {m: f[f"checked/{m}"][...] for m in f["checked"]} if "checked" in f else {})
