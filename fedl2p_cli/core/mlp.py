"""The one MLP of every meta-network: BNNet and LRNet (FedL2P), pFedLA's hypernetwork trunk and CAFeMe's modulator
head. An `MLP` module is a stateless template on the meta device (shapes only, no memory, no RNG drawn); it runs
on explicit parameter dicts through torch.func.functional_call, as the torch.func MAML example does, so the
parameters stay plain tensors that second-order code differentiates and the store saves by name."""

from __future__ import annotations

from functools import cache
from typing import cast

import torch
from torch import Tensor, nn
from torch.func import functional_call


class MLP(nn.ModuleList):
    """Linear layers dims[0] -> ... -> dims[-1], ReLU between them (and after the last one if `final_relu`);
    parameters named `{i}.weight`, `{i}.bias`."""

    def __init__(self, dims: tuple[int, ...], final_relu: bool = False):
        super().__init__(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.final_relu = final_relu

    def forward(self, x: Tensor) -> Tensor:
        for i, layer in enumerate(self):
            x = layer(x)
            if self.final_relu or i < len(self) - 1:
                x = torch.relu(x)
        return x


@cache
def template(dims: tuple[int, ...], final_relu: bool = False) -> MLP:
    with torch.device("meta"):
        return MLP(dims, final_relu)


def shapes(dims: tuple[int, ...], prefix: str) -> dict[str, tuple[int, ...]]:
    """{prefix.i.weight / prefix.i.bias: shape}, in the order the layers run."""
    return {f"{prefix}.{n}": tuple(p.shape) for n, p in template(tuple(dims)).named_parameters()}


def group(params: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The `prefix.`-keyed entries of a flat dict, with the prefix removed."""
    return {k[len(prefix) + 1:]: v for k, v in params.items() if k.startswith(prefix + ".")}


def run(params: dict[str, Tensor], x: Tensor, final_relu: bool = False) -> Tensor:
    """The MLP whose layers `params` holds ({i}.weight: [out, in]) applied to x."""
    n = sum(1 for k in params if k.endswith(".weight"))
    dims = (params["0.weight"].shape[1], *(params[f"{i}.weight"].shape[0] for i in range(n)))
    return cast(Tensor, functional_call(template(dims, final_relu), params, (x,)))
