"""The meta-gradients a FedL2P client update can take (`--meta-grad NAME`): catalog entries of kind "meta-grad",
registered like a model or an executor (`registry.add_meta_grad`; the stage looks the name up and hands the entry to
the client update). Each has one interface, `api.MetaGradient` (declared in fedl2p_cli/protocols.py): `one` computes a
client's meta-gradient after its fine-tuning; a group of clients (the batched executor) runs it per client, or the
entry's `many` where it has one (`api.BatchesClients`). The built-ins' maths is written once, per client
(core.hypergrad's `fomaml_client`, `ift_client`): `one` runs it by torch.autograd, `many` vmaps it. The name is also
the entry's tag in variant names (`fedl2p-NAME-...`), so a new one names itself. The built-ins: FOMAML+ (App. F) and
the IFT (Alg. 2). Adding one is one module with a class like these and one registration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..protocols import HyperMany, LrGradient, MetaGradient
from .lr_grads import LastStep

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from ..core.client import ClientData
    from ..core.finetune import FinetuneResult
    from ..core.hypergrad import MetaGrad
    from ..core.metanets import Lambda
    from ..core.settings import MetaConfig


def _val(datas: list[ClientData], cfg: MetaConfig, gens: list[torch.Generator]) -> list[tuple[Tensor, Tensor]]:
    from ..core.batched import val_batches
    vis = val_batches([d.val[1] for d in datas], cfg.batch_size, gens)
    return [(d.val[0][vi], d.val[1][vi]) for d, vi in zip(datas, vis)]


def _results(out: Any) -> list[MetaGrad]:
    """A group's meta-gradients, their values left on the device (the client update reads them at its end)."""
    from ..core.hypergrad import MetaGrad
    psis = list(out.psi) if out.psi is not None else [0.0] * len(out.grads)
    return [MetaGrad(g, lv, lt, p) for g, lv, lt, p in zip(out.grads, out.val_loss, out.train_loss, psis)]


@dataclass(frozen=True)
class Fomaml:
    """FOMAML+ (App. F): only the last fine-tuning step is differentiated, on its batch and one validation batch."""
    name: str = "fomaml"
    about: str = "FOMAML+ (App. F): the last fine-tuning step differentiated"
    lr: LrGradient = field(default_factory=LastStep)  # --lr-grad: the LRs' path

    def with_lr_grad(self, entry: LrGradient) -> MetaGradient:
        return replace(self, lr=entry)

    def one(self, model: nn.Module, ft: FinetuneResult, lam: Lambda, hyper: Callable[[Lambda], Any], data: ClientData,
            cfg: MetaConfig, gen: torch.Generator) -> MetaGrad:
        from ..core.functional import random_batch
        from ..core.hypergrad import fomaml_gradient
        (xt, yt), (xv, yv) = data.train, data.val
        vi = random_batch(len(yv), cfg.batch_size, gen)
        val = (xv[vi], yv[vi])
        return fomaml_gradient(model, ft.prev_params, lam, hyper, (xt[ft.last_batch], yt[ft.last_batch]),
                               val, ft.bn, cfg.val_stats, eta_step=self.lr.path(ft),
                               eta_slope=self.lr.slope(model, ft, hyper(lam)[0], val, xt, cfg.val_stats))

    def many(self, model: nn.Module, fts: list[FinetuneResult], lams: list[Lambda], hyper: HyperMany,
             inputs: list[tuple[Tensor, Tensor]], datas: list[ClientData], cfg: MetaConfig,
             gens: list[torch.Generator]) -> list[MetaGrad]:
        from ..core.batched import fomaml_many
        val = _val(datas, cfg, gens)
        last = [(d.train[0][ft.last_batch], d.train[1][ft.last_batch]) for d, ft in zip(datas, fts)]
        traj = [self.lr.path(ft) for ft in fts]
        slopes = _slopes(self.lr, model, fts, lams, hyper, inputs, val, datas, cfg)
        return _results(fomaml_many(model, hyper, lams, inputs, [ft.prev_params for ft in fts], last, val,
                                    [ft.bn for ft in fts], cfg.val_stats,
                                    eta_dirs=None if traj[0] is None else traj,  # type: ignore[arg-type]
                                    eta_slopes=slopes))


@dataclass(frozen=True)
class Ift:
    """The implicit function theorem with a Neumann series (Alg. 2; its options --q, --psi, --psi-power, --hessian,
    --ift-at, --eta-grad, --eta-bound, --scale-by-psi)."""
    name: str = "ift"
    about: str = "the implicit function theorem (Alg. 2, the paper's)"
    lr: LrGradient = field(default_factory=LastStep)  # --lr-grad: the LRs' path (last-step: --eta-grad's)

    def with_lr_grad(self, entry: LrGradient) -> MetaGradient:
        return replace(self, lr=entry)

    def one(self, model: nn.Module, ft: FinetuneResult, lam: Lambda, hyper: Callable[[Lambda], Any], data: ClientData,
            cfg: MetaConfig, gen: torch.Generator) -> MetaGrad:
        from ..core.functional import random_batch
        from ..core.hypergrad import ift_hypergradient
        (xt, yt), (xv, yv) = data.train, data.val
        vi = random_batch(len(yv), cfg.batch_size, gen)
        slope = self.lr.slope(model, ft, hyper(lam)[0], (xv[vi], yv[vi]), xt, cfg.val_stats)
        last = cfg.ift_at == "last-step"  # L_T at the last fine-tuning step, on its batch and gradient
        ti = ft.last_batch if last else random_batch(len(yt), cfg.batch_size, gen)
        return ift_hypergradient(model, ft.params, lam, hyper, (xt[ti], yt[ti]), (xv[vi], yv[vi]), ft.bn,
                                 cfg.q, cfg.psi, cfg.scale_by_psi, cfg.hessian, cfg.psi_power,
                                 theta_train=ft.prev_params if last else None,
                                 inner_grad=ft.last_grad if last else None, val_stats=cfg.val_stats,
                                 eta_step=None if slope is not None else _eta_path(self.lr, ft, cfg), eta_slope=slope)

    def many(self, model: nn.Module, fts: list[FinetuneResult], lams: list[Lambda], hyper: HyperMany,
             inputs: list[tuple[Tensor, Tensor]], datas: list[ClientData], cfg: MetaConfig,
             gens: list[torch.Generator]) -> list[MetaGrad]:
        from ..core.batched import ift_many
        from ..core.functional import random_batch
        from ..core.hypergrad import IftSettings
        val = _val(datas, cfg, gens)
        last = cfg.ift_at == "last-step"
        tis = [ft.last_batch if last else random_batch(len(d.train[1]), cfg.batch_size, g)
               for d, ft, g in zip(datas, fts, gens)]
        train = [(d.train[0][ti], d.train[1][ti]) for d, ti in zip(datas, tis)]
        slopes = _slopes(self.lr, model, fts, lams, hyper, inputs, val, datas, cfg)
        paths = None if slopes is not None else [_eta_path(self.lr, ft, cfg) for ft in fts]
        s = IftSettings(cfg.q, cfg.psi, cfg.scale_by_psi, cfg.hessian, cfg.psi_power, cfg.val_stats)
        return _results(ift_many(model, hyper, lams, inputs, [ft.params for ft in fts], train, val,
                                 [ft.bn for ft in fts], s, [ft.prev_params for ft in fts] if last else None,
                                 [ft.last_grad for ft in fts] if last else None,
                                 eta_dirs=paths if paths and paths[0] is not None else None,  # type: ignore[arg-type]
                                 eta_slopes=slopes))


def _slopes(lr: LrGradient, model: nn.Module, fts: list[FinetuneResult], lams: list[Lambda], hyper: HyperMany,
            inputs: list[tuple[Tensor, Tensor]], val: list[tuple[Tensor, Tensor]], datas: list[ClientData],
            cfg: MetaConfig) -> list[Tensor] | None:
    """`lr.slope` for a group, one client at a time (None where the entry hands no slopes)."""
    import torch
    out = []
    for ft, lam, (xi, x), v, d in zip(fts, lams, inputs, val, datas):
        with torch.no_grad():
            beta = hyper(lam, xi, x)[0]
        s = lr.slope(model, ft, beta, v, d.train[0], cfg.val_stats)
        if s is None:
            return None
        out.append(s)
    return out


def _eta_path(lr: LrGradient, ft: FinetuneResult, cfg: MetaConfig) -> list[Tensor] | None:
    """The IFT's LR path: the entry's (--lr-grad), else the last step's (--eta-grad last-step), or none (--eta-grad
    ift: Alg. 2's implicit term)."""
    path = lr.path(ft)
    return path if path is not None else (ft.last_grad if cfg.eta_grad == "last-step" else None)


def group(mg: MetaGradient, model: nn.Module, fts: list[FinetuneResult], lams: list[Lambda], hyper: HyperMany,
          inputs: list[tuple[Tensor, Tensor]], datas: list[ClientData], cfg: MetaConfig,
          gens: list[torch.Generator]) -> list[MetaGrad]:
    """A group's meta-gradients: the entry's `many` where it has one (`api.BatchesClients`), else its `one` per
    client, each with its own inputs and generator (what `one` at a time computes)."""
    from ..protocols import BatchesClients
    if isinstance(mg, BatchesClients):
        return mg.many(model, fts, lams, hyper, inputs, datas, cfg, gens)
    return [mg.one(model, ft, lam, _bound(hyper, inp), d, cfg, g)
            for ft, lam, inp, d, g in zip(fts, lams, inputs, datas, gens)]


def _bound(hyper: HyperMany, inp: tuple[Tensor, Tensor]) -> Callable[[Lambda], Any]:
    return lambda lam: hyper(lam, *inp)


BUILTIN: tuple[MetaGradient, ...] = (Fomaml(), Ift())


def builtin(name: str, lr_grad: str = "last-step") -> MetaGradient:
    """The built-in meta-gradient `name` with the built-in `--lr-grad` entry `lr_grad`; a plugin's comes from the
    catalog (`stages.meta_train.meta_gradient_of`, `with_lr_grad`), which the stage passes to the client update
    (algorithms/ reads no catalog)."""
    from .lr_grads import builtin as lr_builtin
    for mg in BUILTIN:
        if mg.name == name:
            return with_lr_grad(mg, lr_builtin(lr_grad))
    raise ValueError(f"'{name}' is not a built-in meta-gradient: pass the catalog's entry (stages.meta_train.meta_gradient_of)")


def with_lr_grad(mg: MetaGradient, entry: LrGradient) -> MetaGradient:
    """`mg` with its LRs' path from `entry` (`--lr-grad`). A meta-gradient without `with_lr_grad` keeps its own path,
    so it runs only with the last step's entry; any other is refused in one line naming both."""
    from ..core.config import ConfigError
    from ..protocols import TakesLrGrad
    if isinstance(mg, TakesLrGrad):
        return mg.with_lr_grad(entry)
    if entry.name == "last-step":
        return mg
    raise ConfigError(f"--lr-grad {entry.name}: the meta-gradient '{mg.name}' does not take an LR path (it has no "
                      "with_lr_grad); use --lr-grad last-step")
