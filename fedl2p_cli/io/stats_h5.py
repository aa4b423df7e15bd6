"""`stats.h5`: the meta-nets' inputs per client, computed once per (partition, pretrained model).

Layout (plain h5py):
  attrs: model, layer_names, bn_names, param_names (JSON lists), partition, pretrain (artifact ids)
  /client        int64   [C]        client ids (all clients, seen and unseen)
  /domain        int64   [C]
  /unseen        bool    [C]
  /x             float32 [C, 2M]    E(x_m), SD(x_m) of the input of every Conv/BN/Linear layer m, interleaved
  /xi            float32 [C, B]     symmetric KL (Eq. 3) per BN layer, forward order
  /bn_mean/<b>   float32 [C, J_b]   per-channel mean of BN layer b's input over the client's train set
  /bn_var/<b>    float32 [C, J_b]   per-channel (biased) variance
  /pretrained/running_mean/<b>, /pretrained/running_var/<b>  float32 [J_b]  the pretrained statistics, once
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

from ..core.finetune import ClientBN


@dataclass
class StatsTable:
    model: str
    layer_names: list[str]
    bn_names: list[str]
    param_names: list[str]
    client: np.ndarray
    domain: np.ndarray
    unseen: np.ndarray
    x: torch.Tensor
    xi: torch.Tensor
    bn_mean: list[torch.Tensor]  # per BN layer [C, J]
    bn_var: list[torch.Tensor]
    pt_mean: list[torch.Tensor]
    pt_var: list[torch.Tensor]
    parents: dict

    def row(self, c: int) -> int:
        hits = np.nonzero(self.client == c)[0]
        return int(hits[0])

    def inputs(self, c: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(xi [B], x [2M]) of client c."""
        r = self.row(c)
        return self.xi[r], self.x[r]

    def client_bn(self, c: int) -> ClientBN:
        r = self.row(c)
        return ClientBN([m[r].clone() for m in self.bn_mean], [v[r].clone() for v in self.bn_var])


def write(path: Path, t: StatsTable) -> None:
    with h5py.File(path, "w") as f:
        for k in ("model",):
            f.attrs[k] = getattr(t, k)
        for k in ("layer_names", "bn_names", "param_names"):
            f.attrs[k] = json.dumps(getattr(t, k))
        for k, v in t.parents.items():
            f.attrs[k] = v
        f["client"], f["domain"], f["unseen"] = t.client, t.domain, t.unseen
        f["x"], f["xi"] = t.x.numpy(), t.xi.numpy()
        for b in range(len(t.bn_names)):
            f[f"bn_mean/{b}"] = t.bn_mean[b].numpy()
            f[f"bn_var/{b}"] = t.bn_var[b].numpy()
            f[f"pretrained/running_mean/{b}"] = t.pt_mean[b].numpy()
            f[f"pretrained/running_var/{b}"] = t.pt_var[b].numpy()


def read(path: Path) -> StatsTable:
    with h5py.File(path, "r") as f:
        bn_names = json.loads(f.attrs["bn_names"])
        g = lambda name: [torch.from_numpy(f[f"{name}/{b}"][...]) for b in range(len(bn_names))]  # noqa: E731
        return StatsTable(
            str(f.attrs["model"]), json.loads(f.attrs["layer_names"]), bn_names, json.loads(f.attrs["param_names"]),
            f["client"][...], f["domain"][...], f["unseen"][...].astype(bool),
            torch.from_numpy(f["x"][...]), torch.from_numpy(f["xi"][...]), g("bn_mean"), g("bn_var"),
            g("pretrained/running_mean"), g("pretrained/running_var"),
            {k: str(f.attrs[k]) for k in ("partition", "pretrain") if k in f.attrs},
        )
