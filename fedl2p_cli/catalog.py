"""The catalog: every piece a process knows (models, datasets, methods, pFL systems, pretraining algorithms,
executors, meta-gradients), by kind and name, with the plugin that registered it. One object, filled by the plugin
loader (fedl2p_cli/plugins.py): the built-ins and a user's plugins register the same way, and every lookup of every
kind behaves the same (`get` raises `UnknownName` naming the choices, `find` answers None). A lookup names its kind by
a typed key (`get(MODEL, name)` is a `ModelSpec`, `get(META_GRAD, name)` a `MetaGradient`): a misspelt kind does not
type-check. Torch-free, on the bottom floor: it imports the entries' Protocols (fedl2p_cli/protocols.py) and the
package's errors, nothing else (tests/test_layout.py checks)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar, cast

from .errors import FedL2PError
from .protocols import (
    Aggregator,
    LrGradient,
    MetaGradient,
    MetaHead,
    MetaInputs,
    MetaSignal,
    Method,
    ModelFactory,
    PretrainClient,
    PretrainClients,
    ServerStep,
    Source,
    System,
)

API_VERSION = 1  # fedl2p_cli.api's version: a plugin written for another one is refused in one line
BUILTIN_MODULE = "fedl2p_cli.builtin"  # the module that registers the built-ins, as a plugin (algorithms' BUILTIN: their entries)
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True)
class Kind(Generic[T_co]):
    """A kind of piece, typed by what its entries are. `what` and `option`: what a failed lookup calls it and the
    option that names it. `among`: the kinds one lookup searches (methods and systems: `personalize --methods` names
    both); by default its own."""
    name: str
    what: str
    option: str
    among: tuple[str, ...] = ()

    @property
    def kinds(self) -> tuple[str, ...]:
        return self.among or (self.name,)


class PluginError(FedL2PError):
    """A plugin that cannot be loaded or registered (the CLI shows one line, exit 2)."""


class UnknownName(FedL2PError):
    """A name no loaded plugin registered under the kind asked for; the message names the choices."""

    def __init__(self, kind: Kind[object], name: str, choices: list[str], hint: str = ""):
        super().__init__(f"unknown {kind.what} '{name}' ({kind.option})"
                         + f"; choose one of: {', '.join(choices) or 'none loaded'}{hint}"
                         + " (or load the plugin that adds it: --plugin MODULE)")
        self.kind, self.name, self.choices = kind.name, name, choices


@dataclass(frozen=True)
class Plugin:
    """Where registered pieces come from: the module whose `register` ran, and the distribution that installed it
    (None for a module found on the path only, and for the built-ins)."""
    module: str
    dist: str | None = None
    version: str | None = None

    @property
    def builtin(self) -> bool:
        return self.module == BUILTIN_MODULE

    def describe(self) -> str:
        if self.builtin:
            return "fedl2p (built-in)"
        return f"plugin '{self.module}'" + (f" ({self.dist} {self.version})" if self.dist else "")

    def record(self) -> dict:
        """What an artifact's manifest says of it."""
        return {"module": self.module, "dist": self.dist, "version": self.version}


@dataclass(frozen=True)
class ModelSpec:
    """A registered model: `factory(in_channels=, num_classes=)` returns an nn.Module with BatchNorm layers. `head`:
    the classifier's module name (None: the last nn.Linear)."""
    factory: ModelFactory
    about: str = ""
    head: str | None = None
    plugin: Plugin | None = None


@dataclass(frozen=True)
class PretrainAlgo:
    """A pretraining algorithm (`fedl2p pretrain --algo NAME`): `client(model, state, x, y, lr, local_config,
    generator) -> (new state, mean loss)`, one client's local update; the server averages the clients' states by
    sample count. `freeze_head`: the classifier is not trained (FedBABU). `client_many(model, states, xs, ys, lrs,
    local_config, generators) -> [(state, loss)]`: several clients' updates as one computation (the batched executor;
    None: one at a time there)."""
    client: PretrainClient
    about: str = ""
    freeze_head: bool = False
    plugin: Plugin | None = None
    client_many: PretrainClients | None = None


MODEL: Kind[ModelSpec] = Kind("model", "model", "--model")
DATASET: Kind[Source] = Kind("dataset", "dataset", "--dataset")
METHOD: Kind[Method] = Kind("method", "method", "--methods")
SYSTEM: Kind[System] = Kind("system", "pFL system", "--algo")
METHODS: Kind[Method] = Kind("method", "method", "--methods", ("method", "system"))  # a method or a system
PRETRAIN_ALGO: Kind[PretrainAlgo] = Kind("pretrain-algo", "algorithm", "--algo")
META_GRAD: Kind[MetaGradient] = Kind("meta-grad", "meta-gradient", "--meta-grad")
META_HEAD: Kind[MetaHead] = Kind("meta-head", "meta-net head", "--head")
SERVER_STEP: Kind[ServerStep] = Kind("server-step", "server step", "--meta-opt")
LR_GRAD: Kind[LrGradient] = Kind("lr-grad", "LR meta-gradient", "--lr-grad")
META_INPUTS: Kind[MetaInputs] = Kind("meta-inputs", "meta-net inputs", "--input-norm")
META_SIGNAL: Kind[MetaSignal] = Kind("meta-signal", "meta-signal", "--meta-signal")
AGGREGATOR: Kind[Aggregator] = Kind("aggregator", "aggregator", "--aggregate")
KINDS = ("model", "dataset", "method", "system", "pretrain-algo", "executor", "meta-grad", "meta-head",
         "server-step", "lr-grad", "meta-inputs", "meta-signal", "aggregator")  # EXECUTOR: in runtime.py


@dataclass(frozen=True)
class Entry:
    kind: str
    name: str
    value: object  # of the type its kind's key names: `Registry` adds it through a typed `add_*`
    plugin: Plugin


def namespace(kind: str) -> str:
    """Methods and systems share one name space (`personalize --methods` names both)."""
    return "method" if kind == "system" else kind


@dataclass
class Catalog:
    """kind -> name -> entry (the piece and its plugin), in registration order; the plugins in load order. `notes`:
    what the loader has to tell the user once (a plugin that imports fedl2p's internals)."""
    entries: dict[str, dict[str, Entry]] = field(default_factory=lambda: {namespace(k): {} for k in KINDS})
    plugins: dict[str, Plugin] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    loaded: bool = False   # the built-ins and the installed plugins are in (plugins.current() fills it once)
    # modules allowed to import besides the plugins': where the process started (FEDL2P_ALLOW_IMPORT, a worker's
    # parent's list). A command's own (--allow-import, a --model package.module:factory) are its Runtime's
    # `allow_import`, which the stage interface adds for the lookups below a stage (`allowing`)
    allowed: tuple[str, ...] = ()
    quiet: bool = False    # a worker's catalog: its parent already warned about broken plugins

    def allowing(self, modules: Sequence[str]) -> Catalog:
        """This catalog (its pieces shared) with `modules` allowed too; itself where it allows them all already."""
        extra = tuple(dict.fromkeys(m for m in modules if m and m not in self.allowed))
        return replace(self, allowed=self.allowed + extra) if extra else self

    def add(self, plugin: Plugin, pieces: list[tuple[str, str, object]]) -> None:
        """Register a plugin's pieces ((kind, name, value) each) all together, or none of them: a name already taken
        (in this catalog or twice in `pieces`) is refused naming both plugins."""
        seen: set[tuple[str, str]] = set()
        for kind, name, _ in pieces:
            key = (namespace(kind), name)
            if name in self.entries[key[0]] or key in seen:
                other = self.entries[key[0]][name].plugin if name in self.entries[key[0]] else plugin
                raise PluginError(f"{plugin.describe()} registers {kind} '{name}', which {other.describe()} already "
                                  "registers; rename one of them")
            seen.add(key)
        for kind, name, value in pieces:
            self.entries[namespace(kind)][name] = Entry(kind, name, value, plugin)
        self.plugins[plugin.module] = plugin

    def _of(self, kinds: tuple[str, ...]) -> Iterator[Entry]:
        for ns in dict.fromkeys(namespace(k) for k in kinds):
            yield from (e for e in self.entries[ns].values() if e.kind in kinds)

    def find(self, kind: Kind[T], name: str) -> T | None:
        """The piece registered as `name` under `kind` (or any of the kinds it looks among); None if none."""
        return next((cast(T, e.value) for e in self._of(kind.kinds) if e.name == name), None)

    def get(self, kind: Kind[T], name: str, hint: str = "") -> T:
        """The piece registered as `name` under `kind`; `UnknownName` naming the choices if none."""
        value = self.find(kind, name)
        if value is None:
            raise UnknownName(kind, name, self.names(kind), hint)
        return value

    def names(self, kind: Kind[object]) -> list[str]:
        return [e.name for e in self._of(kind.kinds)]

    def values(self, kind: Kind[T]) -> list[T]:
        return [cast(T, e.value) for e in self._of(kind.kinds)]

    def owner(self, kind: Kind[object], name: str) -> Plugin | None:
        entry = self.entries[namespace(kind.name)].get(name)
        return entry.plugin if entry is not None else None

    def active(self) -> list[str]:
        """The modules of the loaded plugins other than the built-ins: what a worker process or Flower site loads."""
        return [m for m, p in self.plugins.items() if not p.builtin]

    def pieces(self) -> dict[str, list[str]]:
        """{kind: ["name (module)", ...]} of what plugins other than the built-ins registered (for --help)."""
        out: dict[str, list[str]] = {}
        for ns in self.entries.values():
            for e in ns.values():
                if not e.plugin.builtin:
                    out.setdefault(e.kind, []).append(f"{e.name} ({e.plugin.module})")
        return out
