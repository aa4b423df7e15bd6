"""The callables a plugin registers, as Protocols: what `registry.add_model` and `add_pretrain_algo` take (and
`Source.load`). Torch-free and below the registry (fedl2p_cli/plugins.py), which types its `add_*` parameters with
them; the plugin API re-exports them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from .algorithms.local import LocalConfig
    from .configs import PartitionConfig
    from .data.datasets import Dataset


class ModelFactory(Protocol):
    """What `registry.add_model` takes: an nn.Module for this many input channels and classes (either parameter may
    be left out). Its BatchNorm1d/2d layers become fedl2p's mixing BN; FedL2P differentiates through it twice, so
    every layer must be twice differentiable (checked when the model is built)."""

    def __call__(self, in_channels: int, num_classes: int) -> nn.Module: ...


class DatasetLoader(Protocol):
    """`Source.load`: the dataset of a partition's config, `data_dir` being --data-dir (or FEDL2P_DATA; None if
    neither). Images uint8 [N, C, H, W], labels, class names, normalisation, optionally a domain per image."""

    def __call__(self, cfg: PartitionConfig, data_dir: Any) -> Dataset: ...


class PretrainClient(Protocol):
    """What `registry.add_pretrain_algo` takes: one client's local update from `state` on (x, y) with this LR, its
    `LocalConfig` and the round's generator; the new state and the mean training loss."""

    def __call__(self, model: nn.Module, state: dict[str, Tensor], x: Tensor, y: Tensor, lr: float, cfg: LocalConfig,
                 gen: torch.Generator) -> tuple[dict[str, Tensor], float]: ...


class PretrainClients(Protocol):
    """`add_pretrain_algo(..., client_many=)`: `PretrainClient` for a list of clients at once (the batched executor);
    per client the same update to float rounding."""

    def __call__(self, model: nn.Module, states: list[dict[str, Tensor]], xs: list[Tensor], ys: list[Tensor],
                 lrs: list[float], cfg: LocalConfig, gens: list[torch.Generator]) -> list[tuple[dict[str, Tensor], float]]: ...
