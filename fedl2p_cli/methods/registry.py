"""One object per personalisation method: its name in --methods, its table label, how it is trained (or that it is
hand-made), how it personalises a client, and which pools it has a model for. Adding a method is one module that
builds such an object plus one `registry.add_method` call in a plugin's `register(registry)` (fedl2p_cli/plugins.py);
`personalize`, `analyze`, the pipeline and the benchmarks read it from here, never by comparing names."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

from .. import protocols
from ..catalog import METHODS, Catalog
from ..protocols import ClientContext, Outcome, Row, Setup

if TYPE_CHECKING:
    from torch import nn

    from ..core.finetune import Strategy

POOLS = ("seen", "unseen")
CHECKED = "-checked"  # a Checked row's name: its learned row's, and this


@dataclass(frozen=True)
class Method:
    """A method kind's behaviour in `personalize` (stages/personalize.py runs one loop over its rows, whatever their
    kind): `resolve` finds the artifact a requested name needs, `prepare` turns it into a row, `strategy` is the
    (beta, eta) the row records for a client, `personalize` is its result for one client and seed (`run`). `setup` is
    the personalisation being prepared (its config and artifacts), `run` one client and seed on the harness
    (methods/context.py types both)."""
    name: str                              # what --methods and pipeline files call it
    label: str                             # its row in result tables
    pools: tuple[str, ...] = POOLS         # where it has a model for a client
    trained_by: ClassVar[str | None] = None  # the stage whose artifact it needs: None (hand-made), meta-train, pfl
    kind: ClassVar[str] = "method"           # its kind in the catalog: method, or system (registry.add_system)

    def supports(self, pool: str) -> bool:
        return pool in self.pools

    def resolve(self, setup: Setup, name: str) -> Any:
        """The artifact a requested `name` stands for (None: the method needs none)."""
        return None

    def prepare(self, setup: Setup, art: Any) -> Row:
        """Its row of a personalisation (`setup.row`), from the artifact `resolve` or a --meta/--pfl id gave."""
        return setup.row(self.name, self)

    def strategy(self, row: Row, setup: Setup, c: int) -> Strategy | None:
        """The Strategy it records for client c (beta, per-tensor LR), on the CPU; None: it records none."""
        return None

    def personalize(self, row: Row, run: ClientContext) -> Outcome:
        raise NotImplementedError

    def wants(self, row: Row, run: ClientContext) -> list[Strategy]:
        """The fine-tunings `personalize` will ask `run` for, so that a batched personalisation (--client-batch)
        computes them ahead with other clients'; a method that names none still works, one client at a time."""
        return []


@dataclass(frozen=True)
class HandMade(Method):
    """Fine-tune every client with one fixed strategy: beta in every BN layer (None: each batch's statistics, BN I)
    and the base LR times `lr_factor` for every tensor, or only for the parameter tensors `tensors(model)` names (the
    others keep their global values). The paper's baselines; "best FT" is the best of them."""
    beta: float | None = 1.0
    lr_factor: float = 1.0
    baseline: bool = True
    tensors: Callable[[nn.Module], Collection[str]] | None = None  # model -> the parameter names it fine-tunes (None: all)

    def fixed(self, factor: float, base_lr: float, n_bn: int, n_p: int, model: nn.Module | None = None) -> Strategy:
        """Its Strategy at `factor` x its LR; LR 0 for the parameter tensors of `model` its `tensors` leaves out."""
        import torch

        from ..core.finetune import Strategy
        from . import check
        check.rate(self, None)  # `before_personalizing` checked it first, naming its plugin
        lr = torch.full((n_p,), base_lr * self.lr_factor * factor)
        if self.tensors is not None:
            chosen = check.tensors(self, model, None)
            lr *= torch.tensor([n in chosen for n, _ in model.named_parameters()],  # type: ignore[union-attr]  # check.tensors refused None
                               dtype=lr.dtype)
        return Strategy(None if self.beta is None else torch.full((n_bn,), float(self.beta)), lr)

    def strategy(self, row: Row, setup: Setup, c: int) -> Strategy | None:
        return self.fixed(1.0, setup.cfg.base_lr, setup.n_bn, setup.n_params, setup.model)

    def personalize(self, row: Row, run: ClientContext) -> Outcome:
        return Outcome(run.handmade(self, 1.0).evaluate("test")[1])

    def wants(self, row: Row, run: ClientContext) -> list[Strategy]:
        return [run.handmade_strategy(self, 1.0)]


@dataclass(frozen=True)
class Tuned(Method):
    """Each client picks one of `candidates` (hand-made strategies, or no fine-tuning) by its own validation split."""
    candidates: Callable[[], list[tuple[str, float]]] = list

    def personalize(self, row: Row, run: ClientContext) -> Outcome:
        import numpy as np

        from ..core.selection import NO_FT, select_by_validation
        grid = self.candidates()
        out = np.zeros((len(grid), 3))
        for i, (name, f) in enumerate(grid):
            if name == NO_FT:
                vl, va = run.unadapted("val")
                out[i] = vl, va, run.unadapted("test")[1]
            else:
                trial = run.handmade(cast(HandMade, run.setup.method(name)), f)  # the candidates are hand-made methods
                out[i] = *trial.evaluate("val"), trial.evaluate("test")[1]
        return Outcome(out[select_by_validation(out[:, 1], out[:, 0]), 2], out)

    def wants(self, row: Row, run: ClientContext) -> list[Strategy]:
        from ..core.selection import NO_FT
        return [run.handmade_strategy(cast(HandMade, run.setup.method(name)), f) for name, f in self.candidates()
                if name != NO_FT]


@dataclass(frozen=True)
class Learned(Method):
    """Strategies from meta-nets lambda (a meta-train artifact): one row per variant, named as tables print it
    (fedl2p-fomaml-std, ...; a variant's identity is its artifact's options). `family` is the one a meta-train
    artifact belongs to (fedl2p; l2p with --local)."""
    family: str = ""
    trained_by: ClassVar[str | None] = "meta-train"

    def resolve(self, setup: Setup, name: str) -> Any:
        # the method's own name means its newest run, whatever its variant (the row is named by the variant)
        return setup.newest_learned(self.family) if name == self.name else setup.newest_meta(name)

    def prepare(self, setup: Setup, art: Any) -> Row:
        return setup.meta_row(self, art)

    def strategy(self, row: Row, setup: Setup, c: int) -> Strategy | None:
        return setup.learned_strategy(row, c)

    def personalize(self, row: Row, run: ClientContext) -> Outcome:
        trial = run.learned(row)  # None: no strategy for this client (L2P and a client it never trained)
        return Outcome(float("nan") if trial is None else trial.evaluate("test", run.setup.cfg.eval_stats)[1])

    def wants(self, row: Row, run: ClientContext) -> list[Strategy]:
        s = run.strategies.get(row.name)
        return [] if s is None else [s]


@dataclass(frozen=True)
class Checked(Learned):
    """A learned method's strategy with its own check: each client fine-tunes under the meta-nets' strategy at its
    LRs x each of `lr_factors`, and compares those and no fine-tuning on its validation split, as ft-tuned compares
    its grid. Costs len(lr_factors) fine-tunings per client (ft-tuned: 9), x1 being the learned row's own. Its rows
    read the artifacts of the learned method of its `family`, one row beside each (named VARIANT-checked)."""
    lr_factors: tuple[float, ...] = (0.1, 1.0, 10.0)

    def resolve(self, setup: Setup, name: str) -> Any:
        return setup.newest_learned(self.family)

    def prepare(self, setup: Setup, art: Any) -> Row:
        row = setup.meta_row(self, art)
        return dataclasses.replace(row, name=f"{row.name}{CHECKED}")  # type: ignore[type-var]  # a setup's rows are dataclasses

    def personalize(self, row: Row, run: ClientContext) -> Outcome:
        import numpy as np

        from ..core.finetune import Strategy
        from ..core.selection import select_by_validation
        s = run.strategies.get(row.name)
        if s is None:
            return Outcome(float("nan"))
        stats = run.setup.cfg.eval_stats
        out = np.zeros((len(self.lr_factors) + 1, 3))
        for i, f in enumerate(self.lr_factors):
            trial = run.finetune(Strategy(s.beta, s.lr * f))
            out[i] = *trial.evaluate("val", stats), trial.evaluate("test", stats)[1]
        vl, va = run.unadapted("val")
        out[-1] = vl, va, run.unadapted("test")[1]
        return Outcome(out[select_by_validation(out[:, 1], out[:, 0]), 2], candidates=out)  # its trials: the pick

    def wants(self, row: Row, run: ClientContext) -> list[Strategy]:
        from ..core.finetune import Strategy
        s = run.strategies.get(row.name)
        return [] if s is None else [Strategy(s.beta, s.lr * f) for f in self.lr_factors]


@dataclass(frozen=True)
class System(Method):
    """Another personalised-FL system with its own models (a pfl artifact): `fedl2p pfl-train --algo NAME`.
    `trainer` names its class, "package.module:Class" (an `api.PFLSystem`: context, strategy, client, save, load,
    accuracy), imported only when the system is used; a bare "package.module" is API 1's module protocol (SETTINGS,
    train, load, accuracy), which trains in this process only."""
    trainer: str = ""
    trained_by: ClassVar[str | None] = "pfl"
    kind: ClassVar[str] = "system"

    def resolve(self, setup: Setup, name: str) -> Any:
        return setup.newest_pfl(name)

    def prepare(self, setup: Setup, art: Any) -> Row:
        return setup.pfl_row(self, art)

    def personalize(self, row: Row, run: ClientContext) -> Outcome:
        return Outcome(run.system(row))  # NaN where it has no model for the client


def names(catalog: Catalog, kind: type = Method) -> tuple[str, ...]:
    return tuple(m.name for m in catalog.values(METHODS) if isinstance(m, kind))


def get(name: str, catalog: Catalog) -> protocols.Method:
    """The method or system registered under `name`; `UnknownName` naming the choices if none."""
    return catalog.get(METHODS, name)


def find(name: str, catalog: Catalog) -> protocols.Method | None:
    """The method or system registered under `name`; None if none (a learned variant's name is not a method: its
    artifact says which method it belongs to, `learned`)."""
    return catalog.find(METHODS, name)


def learned(family: str, catalog: Catalog) -> Learned | None:
    """The learned method a meta-train artifact of `family` belongs to."""
    return next((m for m in catalog.values(METHODS) if isinstance(m, Learned) and m.family == family), None)


def baselines(catalog: Catalog) -> tuple[str, ...]:
    return tuple(m.name for m in catalog.values(METHODS) if isinstance(m, HandMade) and m.baseline)


def handmade(catalog: Catalog) -> tuple[str, ...]:
    """Methods that need no trained artifact (hand-made strategies and their validation-tuned pick)."""
    return tuple(m.name for m in catalog.values(METHODS) if m.trained_by is None)


def systems(catalog: Catalog) -> tuple[str, ...]:
    return names(catalog, System)


def system_trainer(algo: str, catalog: Catalog) -> Any:
    """The system `algo` registered in `catalog`: its class made once (a `PFLSystem`, given the catalog its models are
    looked up in), or its module under API 1's module protocol. What `pfl-train` trains and `personalize` asks for a
    client's accuracy."""
    from .. import imports
    from ..catalog import SYSTEM
    spec = catalog.get(SYSTEM, algo).trainer
    found = imports.load(spec, imports.Why.REGISTERED, declared=[spec])  # the registered system's own trainer
    if ":" not in spec:
        return found  # API 1's module protocol (plugins.register noted it)
    made = found()
    made.catalog = catalog
    return made


def label(name: str, catalog: Catalog) -> str:
    """A row's label: a registered method's, else the row's own name (a learned variant's)."""
    m = find(name, catalog)
    return name if m is None or isinstance(m, Learned) else m.label


def before_personalizing(requested: list[Any], model: Any, catalog: Catalog) -> None:
    """Every hand-made method a personalisation runs (a tuned method's candidates among them), checked once before
    the first client, on the model the harness built."""
    from . import check
    todo = list(requested)
    for m in requested:
        if isinstance(m, Tuned):
            todo += [c for name, _ in m.candidates() if (c := find(name, catalog)) is not None]
    for m in todo:
        if isinstance(m, HandMade):
            check.rate(m, catalog)
            if m.tensors is not None:
                check.tensors(m, model, catalog)
