"""What a client's meta-gradient says to the federation (`meta-train --meta-signal NAME`): catalog entries of kind
"meta-signal", registered like a head (`registry.add_meta_signal`). An entry turns a client's meta-gradient and its
validation loss into the gradient its lambda steps along, before the element-wise clip: the signal every client
sends the server. The built-ins: `loss` (the paper's: dL_V/dlambda as it is) and `log-loss` (d log L_V/dlambda, so a
client's pull is relative to its own loss: a low-loss kind of client is heard as well as a high-loss one)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..protocols import MetaGradient, MetaSignal

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from torch import Tensor, nn

    from ..core.client import ClientData
    from ..core.finetune import FinetuneResult
    from ..core.hypergrad import MetaGrad
    from ..core.metanets import Lambda
    from ..core.settings import MetaConfig
    from ..protocols import HyperMany

LOSS_FLOOR = 0.01  # log-loss: a validation loss below this counts as this (at most x100 a raw gradient)


@dataclass(frozen=True)
class Loss:
    """The paper's: each client sends dL_V/dlambda, so a client's pull grows with its loss's gradient."""
    name: str = "loss"
    about: str = "the paper's: each client's dL_V/dlambda as it is"

    def weigh(self, grads: Lambda, val_loss: Tensor) -> Lambda:
        return grads


@dataclass(frozen=True)
class LogLoss:
    """d log L_V / dlambda = (dL_V/dlambda) / L_V: the federation minimises the clients' mean log validation loss, so
    every client's pull is relative to its own loss (a kind at CE 0.1 is heard as a kind at CE 1.4). Not in the
    paper. L_V is the meta-gradient's validation batch's loss, floored at `LOSS_FLOOR`."""
    name: str = "log-loss"
    about: str = "each client's d log L_V/dlambda: a low-loss kind heard as well as a high-loss one"

    def weigh(self, grads: Lambda, val_loss: Tensor) -> Lambda:
        scale = 1.0 / val_loss.detach().clamp_min(LOSS_FLOOR)
        return {k: g * scale.to(g.dtype) for k, g in grads.items()}


BUILTIN: tuple[MetaSignal, ...] = (Loss(), LogLoss())


def _weighed(signal: MetaSignal, mg: MetaGrad) -> MetaGrad:
    import torch
    like = next(iter(mg.grads.values()))
    loss = mg.val_loss if isinstance(mg.val_loss, torch.Tensor) else like.new_tensor(float(mg.val_loss))
    return replace(mg, grads=signal.weigh(mg.grads, loss))


@dataclass(frozen=True)
class Signalled:
    """A meta-gradient whose every client's gradient goes through `signal` (`--meta-signal`): one client's and a
    group's alike, so the batched and the one-at-a-time updates stay equal."""
    inner: MetaGradient
    signal: MetaSignal

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def about(self) -> str:
        return self.inner.about

    def one(self, model: nn.Module, ft: FinetuneResult, lam: Lambda, hyper: Callable[[Lambda], Any], data: ClientData,
            cfg: MetaConfig, gen: torch.Generator) -> MetaGrad:
        return _weighed(self.signal, self.inner.one(model, ft, lam, hyper, data, cfg, gen))

    def many(self, model: nn.Module, fts: list[FinetuneResult], lams: list[Lambda], hyper: HyperMany,
             inputs: list[tuple[Tensor, Tensor]], datas: list[ClientData], cfg: MetaConfig,
             gens: list[torch.Generator]) -> list[MetaGrad]:
        from .meta_grads import group
        return [_weighed(self.signal, mg) for mg in group(self.inner, model, fts, lams, hyper, inputs, datas, cfg, gens)]


def with_signal(mg: MetaGradient, signal: MetaSignal) -> MetaGradient:
    """`mg` sending `signal`'s gradient; the paper's `loss` leaves it as it is."""
    return mg if signal.name == "loss" else Signalled(mg, signal)
