"""Plugins: what a user brings (models, datasets, methods, pFL systems, pretraining algorithms) from their own package.

A plugin is a module with a `register(registry)` function. fedl2p finds plugins, in this order:
1. our own built-ins (`fedl2p_cli.builtin`), loaded by this same loader, first;
2. every installed package's entry point in the group `fedl2p.plugins` (`name = "module"` or `"module:function"`);
3. the modules named by `FEDL2P_PLUGINS` (comma- or os.pathsep-separated), `fedl2p --plugin MODULE` and a pipeline
   file's top-level `plugins = [...]`.
`register` receives a `Registry` and calls its `add_*` methods; a name that is already taken, a module that does not
import or a `register` that raises is refused as a whole (nothing of it is registered) with one line naming the
plugin. Each registry asks `ensure()` before answering, so the built-ins and installed plugins are there in every
process: the CLI, a worker process, a Flower ClientApp. Torch-free: loading a plugin imports only what it imports.
"""

from __future__ import annotations

import importlib
import inspect
import importlib.metadata as md
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import FedL2PError

GROUP = "fedl2p.plugins"
ENV = "FEDL2P_PLUGINS"
BUILTIN = "fedl2p_cli.builtin"
KINDS = ("model", "dataset", "method", "system", "pretrain-algo")


class PluginError(FedL2PError):
    """A plugin that cannot be loaded or registered (the CLI shows one line, exit 2)."""


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


@dataclass
class _Pending:
    kind: str
    name: str
    commit: Callable[[], None]


@dataclass
class Registry:
    """What a plugin's `register(registry)` receives. Each `add_*` names one piece; the pieces are registered together
    once `register` returns (a clash or an error registers none of them)."""
    plugin: Plugin
    pending: list[_Pending] = field(default_factory=list)

    def add_model(self, name: str, factory: Callable[..., Any], about: str = "", head: str | None = None) -> None:
        """A model: `factory(in_channels=, num_classes=)` (each passed when the factory takes it) returns an nn.Module
        with BatchNorm1d/2d layers, which become fedl2p's mixing BN. `head`: the classifier's module name (what
        FedBABU freezes); default: the last nn.Linear."""
        from .models import registry as models
        self._add("model", name, lambda: models.add(name, models.ModelSpec(factory, about, head, self.plugin)))

    def add_dataset(self, source: Any) -> None:
        """A dataset: a `fedl2p_cli.data.sources.Source` (its loader, channels, classes, normalisation)."""
        from .data import sources
        self._add("dataset", source.name, lambda: sources.add(source, self.plugin))

    def add_method(self, method: Any) -> None:
        """A personalisation method: a `fedl2p_cli.methods.HandMade`, `Tuned` or `Learned`."""
        from . import methods
        if isinstance(method, methods.System):
            raise PluginError(f"{self.plugin.describe()}: '{method.name}' is a System; register it with add_system")
        self._add("method", method.name, lambda: methods.registry.add(method))

    def add_system(self, system: Any) -> None:
        """A personalised-FL system: a `fedl2p_cli.methods.System` whose `trainer` module trains and evaluates it
        (`fedl2p pfl-train --algo NAME`, `personalize --methods NAME`)."""
        from . import methods
        if not isinstance(system, methods.System):
            raise PluginError(f"{self.plugin.describe()}: add_system takes a fedl2p_cli.methods.System")
        self._add("system", system.name, lambda: methods.registry.add(system))

    def add_pretrain_algo(self, name: str, client: Callable[..., Any], about: str = "", freeze_head: bool = False) -> None:
        """A pretraining algorithm (`fedl2p pretrain --algo NAME`): `client(model, state, x, y, lr, local_config,
        generator) -> (new state, mean loss)`, one client's local update; the server averages by samples."""
        from .algorithms import local
        self._add("pretrain-algo", name, lambda: local.add(name, local.PretrainAlgo(client, about, freeze_head, self.plugin)))

    def _add(self, kind: str, name: str, commit: Callable[[], None]) -> None:
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise PluginError(f"{self.plugin.describe()} registers a {kind} named {name!r}: use letters, digits, '.', '_' or '-'")
        self.pending.append(_Pending(kind, name, commit))


_OWNERS: dict[tuple[str, str], Plugin] = {}   # (kind, name) -> the plugin that registered it
_KIND: dict[tuple[str, str], str] = {}        # (name space, name) -> the kind it was registered as
_LOADED: dict[str, Plugin] = {}               # module -> plugin, in load order
_STATE = {"ensured": False, "busy": False}


def _namespace(kind: str) -> str:
    """Methods and systems share one name space (personalize --methods names both)."""
    return "method" if kind == "system" else kind


def owner(kind: str, name: str) -> Plugin | None:
    return _OWNERS.get((_namespace(kind), name))


def loaded() -> list[Plugin]:
    return list(_LOADED.values())


def active() -> list[str]:
    """The modules of the loaded plugins other than the built-ins: what a worker process or Flower site loads too."""
    return [m for m in _LOADED if m != BUILTIN]


def _commit(reg: Registry) -> None:
    seen: set[tuple[str, str]] = set()
    for p in reg.pending:
        key = (_namespace(p.kind), p.name)
        if key in _OWNERS or key in seen:
            other = _OWNERS.get(key, reg.plugin)
            raise PluginError(f"{reg.plugin.describe()} registers {p.kind} '{p.name}', which {other.describe()} already "
                              "registers; rename one of them")
        seen.add(key)
    for p in reg.pending:
        p.commit()
        _OWNERS[(_namespace(p.kind), p.name)] = reg.plugin
        _KIND[(_namespace(p.kind), p.name)] = p.kind


def _register(plugin: Plugin, fn: Callable[[Registry], Any]) -> None:
    reg = Registry(plugin)
    try:
        fn(reg)
    except FedL2PError:
        raise
    except Exception as e:  # noqa: BLE001 - a plugin's bug: one line naming it
        raise PluginError(f"{plugin.describe()} failed in register(): {e.__class__.__name__}: {e}") from None
    _commit(reg)
    _LOADED[plugin.module] = plugin


def _import(module: str, how: str) -> Any:
    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - ImportError, or any error the module raises while importing
        raise PluginError(f"plugin '{module}' ({how}) failed to import: {e.__class__.__name__}: {e}") from None


def _register_fn(obj: Any, module: str, attr: str = "register") -> Callable[[Registry], Any]:
    """An entry point may name the function itself (`module:function`) or the module (its `register`)."""
    fn = getattr(obj, attr, None) if inspect.ismodule(obj) else obj
    if not callable(fn):
        raise PluginError(f"plugin '{module}' has no {attr}(registry) function")
    return fn


def _dist_of(module: str) -> tuple[str | None, str | None]:
    """The installed distribution providing `module`'s top-level package, if any."""
    top = module.split(".")[0]
    dists = md.packages_distributions().get(top, [])
    if not dists:
        return None, None
    try:
        return dists[0], md.version(dists[0])
    except md.PackageNotFoundError:
        return dists[0], None


def load_module(spec: str, how: str = "--plugin") -> Plugin:
    """Load one plugin named by a module (`pkg.mod`, or `pkg.mod:function` for a registration function of another
    name); a module already loaded is not loaded again."""
    module, _, attr = spec.strip().partition(":")
    if not module:
        raise PluginError(f"{how}: an empty plugin name")
    if module in _LOADED:
        return _LOADED[module]
    obj = _import(module, how)
    plugin = Plugin(module, *(_dist_of(module) if module != BUILTIN else (None, None)))
    _register(plugin, _register_fn(obj, module, attr or "register"))
    return plugin


def _entry_points() -> None:
    """Every installed plugin. One that fails (to import, or in register) is left out with a warning: a command that
    needs none of its pieces runs, one that does finds its piece unknown (store inspection, --help, `run tiny`)."""
    for ep in sorted(md.entry_points(group=GROUP), key=lambda e: (e.value, e.name)):
        module = ep.value.partition(":")[0].strip()
        if module in _LOADED or module == BUILTIN:
            continue
        dist = getattr(ep, "dist", None)
        plugin = Plugin(module, dist.name if dist else None, dist.version if dist else None)
        try:
            try:
                obj = ep.load()
            except Exception as e:  # noqa: BLE001
                raise PluginError(f"plugin '{module}' (entry point '{ep.name}' of {plugin.dist}) failed to import: "
                                  f"{e.__class__.__name__}: {e}") from None
            _register(plugin, _register_fn(obj, module))
        except PluginError as e:
            BROKEN.append(str(e))
            if not os.environ.get(_WARNED):  # once: not again in each worker process this one starts
                warn(f"{e}; its pieces are unavailable (pip uninstall {plugin.dist} to silence this)")
    if BROKEN:
        os.environ[_WARNED] = "1"


BROKEN: list[str] = []  # the installed plugins that failed to load, one line each
_WARNED = "FEDL2P_BROKEN_PLUGINS_WARNED"


def warn(line: str) -> None:
    import sys
    print(f"warning: {line}", file=sys.stderr, flush=True)


def from_env() -> list[str]:
    raw = os.environ.get(ENV, "")
    return [s.strip() for s in re.split(rf"[,{re.escape(os.pathsep)}]", raw) if s.strip()]


def ensure() -> None:
    """The built-ins, the installed plugins (entry points) and FEDL2P_PLUGINS's, loaded once per process."""
    if _STATE["ensured"] or _STATE["busy"]:
        return
    _STATE["busy"] = True
    try:
        load_module(BUILTIN, "built-in")
        _entry_points()
        for spec in from_env():
            load_module(spec, ENV)
        _STATE["ensured"] = True
    finally:
        _STATE["busy"] = False


def load(specs: list[str] | tuple[str, ...], how: str = "--plugin") -> list[Plugin]:
    """`ensure()`, then the named plugins (the CLI's --plugin, a pipeline's `plugins`, a worker's list)."""
    ensure()
    return [load_module(s, how) for s in specs]


def pieces() -> dict[str, list[str]]:
    """{kind: ["name (module)", ...]} of what loaded plugins other than the built-ins registered (for --help)."""
    out: dict[str, list[str]] = {}
    for (ns, name), p in _OWNERS.items():
        if not p.builtin:
            kind = _KIND.get((ns, name), ns)
            out.setdefault(kind, []).append(f"{name} ({p.module})")
    return out


def used(names: dict[str, list[str]]) -> list[dict]:
    """The manifest records of the non-built-in plugins owning any of `names` ({kind: [name, ...]})."""
    out: dict[str, dict] = {}
    for kind, values in names.items():
        for v in values:
            p = owner(kind, v)
            if p is not None and not p.builtin:
                out[p.module] = p.record()
            elif p is None and kind == "model" and ":" in v:  # a `package.module:factory` model from an installed package
                dist, version = _dist_of(v.partition(":")[0])
                if dist:
                    out[v] = {"module": v.partition(":")[0], "dist": dist, "version": version, "model": v}
    return list(out.values())


def check_available(records: list[dict], what: str) -> None:
    """Refuse to load an artifact made with a plugin this process has not loaded: name the plugin to install."""
    ensure()
    for r in records:
        module, dist = r.get("module"), r.get("dist")
        if module in _LOADED or (dist and any(p.dist == dist for p in _LOADED.values())):
            continue
        if r.get("model") and _importable(module):  # a `package.module:factory` model: importable is enough
            continue
        pin = f"=={r['version']}" if r.get("version") else ""
        fix = f"pip install {dist}{pin} (or --plugin {module})" if dist else f"load it with --plugin {module}"
        made = f"plugin '{module}'" + (f" ({dist} {r.get('version')})" if dist else "")
        raise PluginError(f"{what} was made with {made}, which is not loaded here: {fix}")


def _importable(module: str) -> bool:
    """Whether `module`'s top-level package is installed, without importing anything (find_spec of a dotted name
    imports its parents: an artifact's text must not run code)."""
    import importlib.util
    try:
        return importlib.util.find_spec(module.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False
