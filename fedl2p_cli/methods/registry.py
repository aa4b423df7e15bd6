"""One object per personalisation method: its name in --methods, its table label, how it is trained (or that it is
hand-made), how it personalises a client, and which pools it has a model for. Adding a method is one module that
builds such an object plus one `registry.add_method` call in a plugin's `register(registry)` (fedl2p_cli/plugins.py); `personalize`, `analyze`, the pipeline and the benchmarks read it
from here, never by comparing names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Collection

from .. import plugins

POOLS = ("seen", "unseen")


@dataclass(frozen=True)
class Method:
    name: str                              # what --methods and pipeline files call it
    label: str                             # its row in result tables
    pools: tuple[str, ...] = POOLS         # where it has a model for a client
    trained_by: ClassVar[str | None] = None  # the stage whose artifact it needs: None (hand-made), meta-train, pfl

    def supports(self, pool: str) -> bool:
        return pool in self.pools


@dataclass(frozen=True)
class HandMade(Method):
    """Fine-tune every client with one fixed strategy: beta in every BN layer (None: each batch's statistics, BN I)
    and the base LR times `lr_factor` for every tensor, or only for the parameter tensors `tensors(model)` names (the
    others keep their global values). The paper's baselines; "best FT" is the best of them."""
    beta: float | None = 1.0
    lr_factor: float = 1.0
    baseline: bool = True
    tensors: Callable[[Any], Collection[str]] | None = None  # model -> the parameter names it fine-tunes (None: all)


@dataclass(frozen=True)
class Tuned(Method):
    """Each client picks one of `candidates` (hand-made strategies, or no fine-tuning) by its own validation split."""
    candidates: Callable[[], list[tuple[str, float]]] = list


@dataclass(frozen=True)
class Learned(Method):
    """Strategies from meta-nets lambda (a meta-train artifact): one name per variant, e.g. fedl2p-fomaml-std. `family`
    is the variant names' first word (fedl2p, l2p)."""
    family: str = ""
    trained_by: ClassVar[str | None] = "meta-train"

    def matches(self, variant: str) -> bool:
        return variant == self.family or variant.startswith(self.family + "-")


@dataclass(frozen=True)
class System(Method):
    """Another personalised-FL system with its own models (a pfl artifact): `fedl2p pfl-train --algo NAME`.
    `trainer` names the module that trains, saves, loads and evaluates it (stages/systems/: SETTINGS, train, load,
    accuracy); it is imported only when the system is used."""
    trainer: str = ""
    trained_by: ClassVar[str | None] = "pfl"


_REGISTRY: dict[str, Method] = {}


def add(method: Method) -> None:
    """Called by plugins.Registry.add_method / add_system (which refuse a name already taken): a plugin's
    `register(registry)` is how a method is added, so that every process that loads the plugin has it."""
    _REGISTRY[method.name] = method


def _methods() -> dict[str, Method]:
    plugins.ensure()
    return _REGISTRY


def names(kind: type = Method) -> tuple[str, ...]:
    return tuple(m.name for m in _methods().values() if isinstance(m, kind))


def get(name: str) -> Method | None:
    """The method a name (or a learned variant's name) stands for; None if none."""
    return _methods().get(name) or learned_of(name)


def learned_of(variant: str) -> Learned | None:
    """The learned method a meta-train variant belongs to (the longest family that matches)."""
    hits = [m for m in _methods().values() if isinstance(m, Learned) and m.matches(variant.removesuffix("-tbs"))]
    return max(hits, key=lambda m: len(m.family), default=None)


def baselines() -> tuple[str, ...]:
    return tuple(m.name for m in _methods().values() if isinstance(m, HandMade) and m.baseline)


def handmade() -> tuple[str, ...]:
    """Methods that need no trained artifact (hand-made strategies and their validation-tuned pick)."""
    return tuple(m.name for m in _methods().values() if m.trained_by is None)


def systems() -> tuple[str, ...]:
    return names(System)


def label(name: str) -> str:
    m = get(name)
    return name if m is None or isinstance(m, Learned) else m.label
