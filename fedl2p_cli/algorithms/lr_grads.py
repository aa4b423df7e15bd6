"""The learned LRs' meta-gradients a FedL2P run can take (`meta-train --lr-grad NAME`): catalog entries of kind
"lr-grad", registered like a meta-gradient (`registry.add_lr_grad`). An entry says along which path the fine-tuning's
LRs moved theta* (`path`), or hands the LRs' per-tensor slopes dL_V/d log eta directly (`slope`); the meta-gradient
(`--meta-grad`) differentiates the rest. A meta-gradient takes an entry through its `with_lr_grad`
(algorithms/meta_grads.py). The built-ins: the last step (App. F), the whole trajectory, and the trajectory through the
recomputed BN statistics (docs/results/accuracy.md#lr-gradient measures each against finite differences)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..protocols import LrGradient

if TYPE_CHECKING:
    from torch import Tensor, nn

    from ..core.finetune import FinetuneResult


@dataclass(frozen=True)
class LastStep:
    """App. F: the LRs' gradient through the last fine-tuning step only (FOMAML+), or the IFT's `--eta-grad` path."""
    name: str = "last-step"
    about: str = "App. F: through the last fine-tuning step only"

    def path(self, ft: FinetuneResult) -> list[Tensor] | None:
        return None

    def slope(self, model: nn.Module, ft: FinetuneResult, beta: Tensor, val: tuple[Tensor, Tensor], x_train: Tensor,
              val_stats: str) -> Tensor | None:
        return None


@dataclass(frozen=True)
class Trajectory:
    """dL_V/d log eta_k ~ dL_V/dtheta*_k . (theta*_k - theta_g,k): the whole fine-tuning's summed gradient is the path
    (the client's BN statistics held; not in the paper)."""
    name: str = "trajectory"
    about: str = "the whole fine-tuning's path (summed gradient), BN statistics held"

    def path(self, ft: FinetuneResult) -> list[Tensor] | None:
        if ft.grad_sum is None:
            raise ValueError(f"--lr-grad {self.name} needs the fine-tuning's summed gradient (FinetuneResult.grad_sum)")
        return ft.grad_sum

    def slope(self, model: nn.Module, ft: FinetuneResult, beta: Tensor, val: tuple[Tensor, Tensor], x_train: Tensor,
              val_stats: str) -> Tensor | None:
        return None


@dataclass(frozen=True)
class TrajectoryBn(Trajectory):
    """The trajectory estimate taken through the client's BN statistics too, recomputed from theta* as evaluation
    recomputes them (core.hypergrad.lr_slope_bn: one full-batch pass over the client's training data more)."""
    name: str = "trajectory-bn"
    about: str = "the whole fine-tuning's path, through the recomputed BN statistics"

    def slope(self, model: nn.Module, ft: FinetuneResult, beta: Tensor, val: tuple[Tensor, Tensor], x_train: Tensor,
              val_stats: str) -> Tensor | None:
        from ..core.hypergrad import lr_slope_bn
        return lr_slope_bn(model, ft.params, beta, val, x_train, self.path(ft) or [], val_stats)


@dataclass(frozen=True)
class Unrolled(Trajectory):
    """The LRs' exact meta-gradient: reverse mode through every fine-tuning step and the recomputed BN statistics
    (core.hypergrad.lr_slope_unrolled; about 3-4x a fine-tuning more, memory growing with its steps). Where the
    trajectory estimates assume the gradients along the way do not depend on the LRs, this stays exact at a trained
    lambda (docs/results/accuracy.md#lr-gradient). Not in the paper."""
    name: str = "unrolled"
    about: str = "exact: through every fine-tuning step and the recomputed BN statistics"

    def slope(self, model: nn.Module, ft: FinetuneResult, beta: Tensor, val: tuple[Tensor, Tensor], x_train: Tensor,
              val_stats: str) -> Tensor | None:
        from ..core.hypergrad import lr_slope_unrolled
        if ft.replay is None:
            raise ValueError(f"--lr-grad {self.name} needs the fine-tuning's steps (FinetuneResult.replay)")
        return lr_slope_unrolled(model, ft.replay, beta, val, val_stats)


BUILTIN: tuple[LrGradient, ...] = (LastStep(), Trajectory(), TrajectoryBn(), Unrolled())


def builtin(name: str) -> LrGradient:
    """The built-in LR meta-gradient `name`; a plugin's comes from the catalog, which the stage passes down."""
    for entry in BUILTIN:
        if entry.name == name:
            return entry
    raise ValueError(f"'{name}' is not a built-in LR meta-gradient: pass the catalog's entry")
