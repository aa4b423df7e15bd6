"""The catalog: every piece a process knows (models, datasets, methods, pFL systems, pretraining algorithms,
executors, meta-gradients), by kind
and name, with the plugin that registered it. One object, filled by the plugin loader (fedl2p_cli/plugins.py): the
built-ins and a user's plugins register the same way, and every lookup of every kind behaves the same (`get` raises
`UnknownName` naming the choices, `find` answers None). Torch-free; at run time it imports only the package's errors
(the entries' types below are imported for the type checker only)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, overload

from .errors import FedL2PError

if TYPE_CHECKING:  # the entries' types, for `get` and `find` typed per kind
    from .algorithms.meta_grads import MetaGradient
    from .data.sources import Source
    from .engine.interface import Executor
    from .methods.registry import Method, System

API_VERSION = 1  # fedl2p_cli.api's version: a plugin written for another one is refused in one line
BUILTIN = "fedl2p_cli.builtin"
KINDS = ("model", "dataset", "method", "system", "pretrain-algo", "executor", "meta-grad")
# what a kind is called where a lookup fails, and the option that names it
WHAT = {"model": ("model", "--model"), "dataset": ("dataset", "--dataset"), "method": ("method", "--methods"),
        "system": ("pFL system", "--algo"), "pretrain-algo": ("algorithm", "--algo"), "executor": ("executor", "--engine"),
        "meta-grad": ("meta-gradient", "--meta-grad")}


class PluginError(FedL2PError):
    """A plugin that cannot be loaded or registered (the CLI shows one line, exit 2)."""


class UnknownName(FedL2PError):
    """A name no loaded plugin registered under the kind asked for; the message names the choices."""

    def __init__(self, kind: str, name: str, choices: list[str], hint: str = ""):
        what, option = WHAT.get(kind, (kind, ""))
        super().__init__(f"unknown {what} '{name}'" + (f" ({option})" if option else "")
                         + f"; choose one of: {', '.join(choices) or 'none loaded'}{hint}"
                         + " (or load the plugin that adds it: --plugin MODULE)")
        self.kind, self.name, self.choices = kind, name, choices


@dataclass(frozen=True)
class Plugin:
    """Where registered pieces come from: the module whose `register` ran, and the distribution that installed it
    (None for a module found on the path only, and for the built-ins)."""
    module: str
    dist: str | None = None
    version: str | None = None

    @property
    def builtin(self) -> bool:
        return self.module == BUILTIN

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
    factory: Callable[..., Any]
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
    client: Callable[..., Any]
    about: str = ""
    freeze_head: bool = False
    plugin: Plugin | None = None
    client_many: Callable[..., Any] | None = None


@dataclass(frozen=True)
class Entry:
    kind: str
    name: str
    value: Any
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
    # modules the user allowed to import besides the plugins' (--allow-import, FEDL2P_ALLOW_IMPORT, --model
    # package.module:factory): a worker process receives them in its Runtime (`allow_import`)
    allowed: list[str] = field(default_factory=list)
    quiet: bool = False    # a worker's catalog: its parent already warned about broken plugins

    def allow(self, module: str) -> None:
        if module and module not in self.allowed:
            self.allowed.append(module)

    def add(self, plugin: Plugin, pieces: list[tuple[str, str, Any]]) -> None:
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

    @overload
    def find(self, kind: Literal["model"], name: str) -> ModelSpec | None: ...
    @overload
    def find(self, kind: Literal["pretrain-algo"], name: str) -> PretrainAlgo | None: ...
    @overload
    def find(self, kind: Literal["executor"], name: str) -> Executor | None: ...
    @overload
    def find(self, kind: Literal["meta-grad"], name: str) -> MetaGradient | None: ...
    @overload
    def find(self, kind: Literal["dataset"], name: str) -> Source | None: ...
    @overload
    def find(self, kind: Literal["system"], name: str) -> System | None: ...
    @overload
    def find(self, kind: Literal["method"] | tuple[Literal["method"], Literal["system"]], name: str) -> Method | None: ...
    @overload
    def find(self, kind: str | tuple[str, ...], name: str) -> Any: ...

    def find(self, kind: str | tuple[str, ...], name: str) -> Any:
        """The piece registered as `name` under `kind` (or any of several kinds); None if none."""
        kinds = (kind,) if isinstance(kind, str) else kind
        return next((e.value for e in self._of(kinds) if e.name == name), None)

    @overload
    def get(self, kind: Literal["model"], name: str, hint: str = "") -> ModelSpec: ...
    @overload
    def get(self, kind: Literal["pretrain-algo"], name: str, hint: str = "") -> PretrainAlgo: ...
    @overload
    def get(self, kind: Literal["executor"], name: str, hint: str = "") -> Executor: ...
    @overload
    def get(self, kind: Literal["meta-grad"], name: str, hint: str = "") -> MetaGradient: ...
    @overload
    def get(self, kind: Literal["dataset"], name: str, hint: str = "") -> Source: ...
    @overload
    def get(self, kind: Literal["system"], name: str, hint: str = "") -> System: ...
    @overload
    def get(self, kind: Literal["method"] | tuple[Literal["method"], Literal["system"]], name: str, hint: str = "") -> Method: ...
    @overload
    def get(self, kind: str | tuple[str, ...], name: str, hint: str = "") -> Any: ...

    def get(self, kind: str | tuple[str, ...], name: str, hint: str = "") -> Any:
        """The piece registered as `name` under `kind`; `UnknownName` naming the choices if none."""
        value = self.find(kind, name)
        if value is None:
            kinds = (kind,) if isinstance(kind, str) else kind
            raise UnknownName(kinds[0], name, self.names(kind), hint)
        return value

    def names(self, kind: str | tuple[str, ...]) -> list[str]:
        return [e.name for e in self._of((kind,) if isinstance(kind, str) else kind)]

    def values(self, kind: str | tuple[str, ...]) -> list[Any]:
        return [e.value for e in self._of((kind,) if isinstance(kind, str) else kind)]

    def owner(self, kind: str, name: str) -> Plugin | None:
        entry = self.entries[namespace(kind)].get(name)
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
