"""Plugins: what a user brings (models, datasets, methods, pFL systems, pretraining algorithms) from their own package.

A plugin is a module with a `register(registry)` function. The loader fills a `Catalog` (fedl2p_cli/catalog.py) from,
in this order:
1. our own built-ins (`fedl2p_cli.builtin`), loaded by this same loader, first;
2. every installed package's entry point in the group `fedl2p.plugins` (`name = "module"` or `"module:function"`);
3. the modules named by `FEDL2P_PLUGINS` (comma- or os.pathsep-separated), `fedl2p --plugin MODULE` and a pipeline
   file's top-level `plugins = [...]`.
`register` receives a `Registry` and calls its `add_*` methods; a name that is already taken, a module that does not
import, a `register` that raises or a plugin written for another `API_VERSION` (its module's `FEDL2P_API`) is refused
as a whole (nothing of it is registered) with one line naming the plugin. A command's catalog travels with its
`Runtime` (`runtime.catalog`; a worker process or Flower ClientApp builds its own from the runtime's `plugins`):
every lookup below the entry points asks `of(runtime)`, which refuses a Runtime that carries none. The stage interface
also puts it in place (`using`) for a plugin's code handed none (`api.build_model` without `catalog=`); `current()`
answers from it, or at an entry point from the context's own catalog, filled with the built-ins and the installed
plugins on first use.
Torch-free: loading a plugin imports only what it imports.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import inspect
import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

from . import imports
from .catalog import (
    AGGREGATOR,
    API_VERSION,
    BUILTIN_MODULE,
    DATASET,
    KINDS,
    LR_GRAD,
    META_GRAD,
    META_HEAD,
    META_INPUTS,
    META_SIGNAL,
    METHOD,
    MODEL,
    PRETRAIN_ALGO,
    SERVER_STEP,
    SYSTEM,
    Catalog,
    Kind,
    ModelSpec,
    Plugin,
    PluginError,
    PretrainAlgo,
)
from .errors import FedL2PError
from .runtime import EXECUTOR

if TYPE_CHECKING:
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
    from .runtime import Executor, Runtime

T = TypeVar("T")

GROUP = "fedl2p.plugins"
ENV = "FEDL2P_PLUGINS"
__all__ = ["API_VERSION", "BUILTIN_MODULE", "KINDS", "Plugin", "PluginError", "Registry", "build", "current", "load", "of", "using"]


@dataclass
class Registry:
    """What a plugin's `register(registry)` receives. Each `add_*` names one piece; the pieces are registered together
    once `register` returns (a clash or an error registers none of them)."""
    plugin: Plugin
    pending: list[tuple[str, str, object]] = field(default_factory=list)

    def add_model(self, name: str, factory: ModelFactory, about: str = "", head: str | None = None) -> None:
        """A model: `factory(in_channels=, num_classes=)` (each passed when the factory takes it) returns an nn.Module
        with BatchNorm1d/2d layers, which become fedl2p's mixing BN. `head`: the classifier's module name (what
        FedBABU freezes); default: the last nn.Linear."""
        if not callable(factory):
            raise PluginError(f"{self.plugin.describe()}: model '{name}': its factory is not callable")
        self._add(MODEL, name, ModelSpec(factory, about, head, self.plugin))

    def add_dataset(self, source: Source) -> None:
        """A dataset: an `api.Source` (its loader, channels, classes, normalisation)."""
        if not callable(getattr(source, "load", None)):
            raise PluginError(f"{self.plugin.describe()}: dataset '{getattr(source, 'name', source)}': its load is "
                              "not callable")
        self._add(DATASET, source.name, source)

    def add_method(self, method: Method) -> None:
        """A personalisation method: an `api.HandMade`, `Tuned` or `Learned`."""
        if getattr(method, "kind", None) == "system":
            raise PluginError(f"{self.plugin.describe()}: '{method.name}' is a System; register it with add_system")
        self._add(METHOD, method.name, method)

    def add_system(self, system: System) -> None:
        """A personalised-FL system: an `api.System` whose `trainer` ("package.module:Class", an `api.PFLSystem`)
        trains and evaluates it (`fedl2p pfl-train --algo NAME`, `personalize --methods NAME`)."""
        if getattr(system, "kind", None) != "system":
            raise PluginError(f"{self.plugin.describe()}: add_system takes an api.System")
        self._add(SYSTEM, system.name, system)

    def add_pretrain_algo(self, name: str, client: PretrainClient, about: str = "", freeze_head: bool = False,
                          client_many: PretrainClients | None = None) -> None:
        """A pretraining algorithm (`fedl2p pretrain --algo NAME`): `client(model, state, x, y, lr, local_config,
        generator) -> (new state, mean loss)`, one client's local update; the server averages by samples.
        `client_many` (optional): the same for a list of clients at once, for `--engine batched`."""
        self._add(PRETRAIN_ALGO, name, PretrainAlgo(client, about, freeze_head, self.plugin, client_many))

    def add_executor(self, executor: Executor) -> None:
        """Where a round's client updates run (`--engine NAME`): an `api.Executor` (its `name`, `about`,
        `check(runtime)` and `open(job)` returning a pool whose `map(tasks)` gives the results in task order)."""
        if not all(hasattr(executor, a) for a in ("name", "about", "check", "open")):
            raise PluginError(f"{self.plugin.describe()}: add_executor takes an api.Executor (name, about, check, open)")
        self._add(EXECUTOR, executor.name, executor)

    def add_meta_grad(self, meta_grad: MetaGradient) -> None:
        """A FedL2P meta-gradient (`--meta-grad NAME`, and its tag in variant names): an `api.MetaGradient` (its
        `name`, `about` and `one(...)` for one client; a group runs it per client, or its optional `many(...)`)."""
        if not all(hasattr(meta_grad, a) for a in ("name", "about", "one")):
            raise PluginError(f"{self.plugin.describe()}: add_meta_grad takes an api.MetaGradient (name, about, one)")
        self._add(META_GRAD, meta_grad.name, meta_grad)

    def add_meta_head(self, head: MetaHead) -> None:
        """How FedL2P's meta-nets' outputs become a strategy (`meta-train --head NAME`): an `api.MetaHead` (its
        `name`, `about`, `init(...)` drawing lambda and `hyperparameters(...)` giving beta and eta)."""
        if not all(hasattr(head, a) for a in ("name", "about", "init", "hyperparameters")):
            raise PluginError(f"{self.plugin.describe()}: add_meta_head takes an api.MetaHead (name, about, init, "
                              "hyperparameters)")
        self._add(META_HEAD, head.name, head)

    def add_server_step(self, step: ServerStep) -> None:
        """How the server moves lambda each round (`meta-train --meta-opt NAME`): an `api.ServerStep` (its `name`,
        `about` and `step(lam, combined, state, t, lr)`)."""
        if not all(hasattr(step, a) for a in ("name", "about", "step")):
            raise PluginError(f"{self.plugin.describe()}: add_server_step takes an api.ServerStep (name, about, step)")
        self._add(SERVER_STEP, step.name, step)

    def add_lr_grad(self, lr_grad: LrGradient) -> None:
        """How FedL2P's learned LRs get their meta-gradient (`meta-train --lr-grad NAME`): an `api.LrGradient` (its
        `name`, `about`, `path(ft)` and `slope(...)`); a meta-gradient takes it through its `with_lr_grad`."""
        if not all(hasattr(lr_grad, a) for a in ("name", "about", "path", "slope")):
            raise PluginError(f"{self.plugin.describe()}: add_lr_grad takes an api.LrGradient (name, about, path, slope)")
        self._add(LR_GRAD, lr_grad.name, lr_grad)

    def add_meta_inputs(self, entry: MetaInputs) -> None:
        """What FedL2P's meta-nets read (`meta-train --input-norm NAME`): an `api.MetaInputs` (its `name`, `about`,
        `fit(xi, x)` over the seen clients and `apply(state, xi, x)` for one client)."""
        if not all(hasattr(entry, a) for a in ("name", "about", "fit", "apply")):
            raise PluginError(f"{self.plugin.describe()}: add_meta_inputs takes an api.MetaInputs (name, about, fit, apply)")
        self._add(META_INPUTS, entry.name, entry)

    def add_meta_signal(self, entry: MetaSignal) -> None:
        """What a FedL2P client's meta-gradient says to the federation (`meta-train --meta-signal NAME`): an
        `api.MetaSignal` (its `name`, `about` and `weigh(grads, val_loss)`)."""
        if not all(hasattr(entry, a) for a in ("name", "about", "weigh")):
            raise PluginError(f"{self.plugin.describe()}: add_meta_signal takes an api.MetaSignal (name, about, weigh)")
        self._add(META_SIGNAL, entry.name, entry)

    def add_aggregator(self, entry: Aggregator) -> None:
        """How a FedL2P server combines a round's replies (`meta-train --aggregate NAME`): an `api.Aggregator` (its
        `name`, `about` and `combine(sent, lams, weights)`)."""
        if not all(hasattr(entry, a) for a in ("name", "about", "combine")):
            raise PluginError(f"{self.plugin.describe()}: add_aggregator takes an api.Aggregator (name, about, combine)")
        self._add(AGGREGATOR, entry.name, entry)

    def _add(self, kind: Kind[T], name: str, value: T) -> None:
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise PluginError(f"{self.plugin.describe()} registers a {kind.name} named {name!r}: use letters, digits, '.', '_' or '-'")
        self.pending.append((kind.name, name, value))


def register(catalog: Catalog, plugin: Plugin, fn: Callable[[Registry], object]) -> None:
    """Run a plugin's `register` and add what it registered to `catalog`, all of it or nothing."""
    reg = Registry(plugin)
    try:
        fn(reg)
    except FedL2PError:
        raise
    except Exception as e:  # noqa: BLE001 - a plugin's bug: one line naming it
        raise PluginError(f"{plugin.describe()} failed in register(): {e.__class__.__name__}: {e}") from None
    catalog.add(plugin, reg.pending)
    for kind, name, value in reg.pending:
        trainer = getattr(value, "trainer", ":") if kind == SYSTEM.name else ":"
        if ":" not in trainer:  # API 1's module protocol: still trains, in this process
            catalog.notes.append(f"pFL system '{name}' ({plugin.describe()}) is a module of functions ({trainer}), "
                                 "which trains in this process only: make it an api.PFLSystem class and register "
                                 f"trainer=\"{trainer}:ClassName\" to run it under --workers and --engine flower")


def _import(module: str, how: str) -> object:
    """A plugin the user named (`how`: --plugin, FEDL2P_PLUGINS, a pipeline's `plugins`) or the built-in one."""
    try:
        return imports.load(module, imports.Why.PLUGIN, declared=[module])
    except imports.ImportRefused:
        raise
    except Exception as e:  # noqa: BLE001 - ImportError, or any error the module raises while importing
        raise PluginError(f"plugin '{module}' ({how}) failed to import: {e.__class__.__name__}: {e}") from None


def _register_fn(obj: object, module: str, attr: str = "register") -> Callable[[Registry], object]:
    """An entry point may name the function itself (`module:function`) or the module (its `register`)."""
    fn = getattr(obj, attr, None) if inspect.ismodule(obj) else obj
    if not callable(fn):
        raise PluginError(f"plugin '{module}' has no {attr}(registry) function")
    return fn


def check_api(module: str) -> None:
    """A plugin module may say which API it was written for (`FEDL2P_API = 1`); another one is refused."""
    declared = getattr(_import(module, "loaded"), "FEDL2P_API", None)
    if declared is not None and declared != API_VERSION:
        raise PluginError(f"plugin '{module}' is written for fedl2p API {declared!r}; this fedl2p has API {API_VERSION}: "
                          f"install a release of the plugin for API {API_VERSION}")


def internal_imports(module: str) -> list[str]:
    """The fedl2p modules other than `fedl2p_cli.api` that a plugin's source files import (its package's files, or
    its one file), read with ast: what may break it when fedl2p's internals change."""
    mod = _import(module, "loaded")
    path = Path(getattr(mod, "__file__", None) or "")
    files = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path] if path.suffix == ".py" else []
    found: set[str] = set()
    for f in files:
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found |= {f"{node.module}.{a.name}" if node.module == "fedl2p_cli" else node.module for a in node.names}
    return sorted(m for m in found if m.split(".")[0] == "fedl2p_cli" and m not in ("fedl2p_cli", "fedl2p_cli.api"))


def _note_internals(catalog: Catalog, module: str) -> None:
    names = internal_imports(module)
    if names:
        catalog.notes.append(f"plugin '{module}' imports fedl2p's internals ({', '.join(names)}), which may change "
                             "without notice: import fedl2p_cli.api only (docs/reference/plugin-api.md)")


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


def _load(catalog: Catalog, plugin: Plugin, obj: object, attr: str = "register") -> Plugin:
    if not plugin.builtin:
        check_api(plugin.module)
    register(catalog, plugin, _register_fn(obj, plugin.module, attr))
    if not plugin.builtin:
        _note_internals(catalog, plugin.module)
    return plugin


def load_module(catalog: Catalog, spec: str, how: str = "--plugin") -> Plugin:
    """Load one plugin named by a module (`pkg.mod`, or `pkg.mod:function` for a registration function of another
    name) into `catalog`; a module already loaded is not loaded again."""
    module, _, attr = spec.strip().partition(":")
    if not module:
        raise PluginError(f"{how}: an empty plugin name")
    if module in catalog.plugins:
        return catalog.plugins[module]
    obj = _import(module, how)
    plugin = Plugin(module, *(_dist_of(module) if module != BUILTIN_MODULE else (None, None)))
    return _load(catalog, plugin, obj, attr or "register")


def _entry_points(catalog: Catalog) -> None:
    """Every installed plugin. One that fails (to import, or in register) is left out with a warning: a command that
    needs none of its pieces runs, one that does finds its piece unknown (store inspection, --help, `run tiny`)."""
    for ep in sorted(md.entry_points(group=GROUP), key=lambda e: (e.value, e.name)):
        module = ep.value.partition(":")[0].strip()
        if module in catalog.plugins or module == BUILTIN_MODULE:
            continue
        dist = getattr(ep, "dist", None)
        plugin = Plugin(module, dist.name if dist else None, dist.version if dist else None)
        try:
            try:
                obj = imports.load(ep.value.split("[")[0].replace(" ", ""), imports.Why.PLUGIN, declared=[module])  # installed
            except Exception as e:  # noqa: BLE001
                raise PluginError(f"plugin '{module}' (entry point '{ep.name}' of {plugin.dist}) failed to import: "
                                  f"{e.__class__.__name__}: {e}") from None
            _load(catalog, plugin, obj)
        except PluginError as e:
            if not catalog.quiet:  # once: not again in each worker process this one starts
                warn(f"{e}; its pieces are unavailable (pip uninstall {plugin.dist} to silence this)")


def warn(line: str) -> None:
    import sys
    print(f"warning: {line}", file=sys.stderr, flush=True)


def _split(raw: str) -> list[str]:
    return [s.strip() for s in re.split(rf"[,{re.escape(os.pathsep)}]", raw) if s.strip()]


def from_env() -> list[str]:
    return _split(os.environ.get(ENV, ""))


ALLOW_ENV = "FEDL2P_ALLOW_IMPORT"


def as_worker(allow: Sequence[str], specs: Sequence[str] = (), how: str = "the parent process's plugins") -> Catalog:
    """A worker process's or Flower ClientApp's own catalog, made before it looks anything up: the built-ins and
    installed plugins, its parent's allow list and plugins `specs` (from the Runtime it received), and no second
    warning about a broken plugin the parent already named. Returned, to travel with its runtime, and put in place
    for the code handed none (`current`)."""
    catalog = fill(Catalog(allowed=tuple(allow), quiet=True))
    for spec in specs:
        load_module(catalog, spec, how)
    _CURRENT.set(catalog)
    return catalog


def fill(catalog: Catalog, installed: bool = True) -> Catalog:
    """The built-ins, then (with `installed`) the installed plugins' entry points and FEDL2P_PLUGINS's modules."""
    catalog.loaded = True  # before loading: a lookup made while a plugin registers sees what is there so far
    # the user's allow list, read where the process starts
    catalog.allowed = tuple(dict.fromkeys((*catalog.allowed, *_split(os.environ.get(ALLOW_ENV, "")))))
    try:
        load_module(catalog, BUILTIN_MODULE, "built-in")
        if installed:
            _entry_points(catalog)
            for spec in from_env():
                load_module(catalog, spec, ENV)
    except BaseException:
        catalog.loaded = False
        raise
    return catalog


def build(*plugins: str | Callable[[Registry], object], installed: bool = False) -> Catalog:
    """A catalog of its own: the built-ins, the installed plugins if `installed`, then each of `plugins`, a module
    name or a `register` function (a test's own pieces, owned by a plugin named after the function's module; they
    stay in this process: worker processes load plugins by module)."""
    catalog = fill(Catalog(), installed)
    for p in plugins:
        if isinstance(p, str):
            load_module(catalog, p)
        else:
            register(catalog, Plugin(p.__module__), p)
    return catalog


_CURRENT: ContextVar[Catalog | None] = ContextVar("fedl2p_catalog", default=None)


def current() -> Catalog:
    """The catalog lookups answer from: the one the running stage's Runtime carries (`using`, entered at the stage
    interface), else this context's own, created on first use and filled with the built-ins, the installed plugins and
    FEDL2P_PLUGINS's, and whatever `load` added since. No process-wide object: a thread or `contextvars` context
    that sets none starts its own."""
    catalog = _chosen()
    return catalog if catalog.loaded else fill(catalog)


class NoCatalog(FedL2PError):
    """A run below the entry points was handed no catalog: a lookup there never answers from the context's own, so a
    missed hand-over stops at the first lookup instead of silently using other pieces."""


def of(runtime: Runtime) -> Catalog:
    """The catalog a run looks up: the one its Runtime carries (the command line, a worker, a Flower app or a test put
    it there), allowing the modules the runtime names (`allow_import`: --allow-import, --model package.module:factory).
    A runtime that carries none is refused (`NoCatalog`): below the entry points nothing falls back on `current()`."""
    if runtime.catalog is None:
        raise NoCatalog("this run's Runtime carries no catalog: hand one over (Runtime(catalog=plugins.build()), or "
                        "run it through the command line or a Flower app)")
    return runtime.catalog.allowing(runtime.allow_import)


def _chosen() -> Catalog:
    """The context's catalog, filled or not (created empty where the context has none)."""
    catalog = _CURRENT.get()
    if catalog is None:
        catalog = Catalog()
        _CURRENT.set(catalog)
    return catalog


@contextmanager
def using(catalog: Catalog) -> Iterator[Catalog]:
    """Within it, `current()` is `catalog` (in this thread and context)."""
    token = _CURRENT.set(catalog)
    try:
        yield catalog
    finally:
        _CURRENT.reset(token)


def load(specs: Sequence[str], how: str = "--plugin") -> list[Plugin]:
    """The named plugins (the CLI's --plugin, a pipeline's `plugins`, a worker's list), into the current catalog."""
    catalog = current()
    return [load_module(catalog, s, how) for s in specs]


def used(names: dict[Kind[object], list[str]], catalog: Catalog) -> list[dict]:
    """The manifest records of the non-built-in plugins owning any of `names` ({kind: [name, ...]}) in `catalog`."""
    out: dict[str, dict] = {}
    for kind, values in names.items():
        for v in values:
            p = catalog.owner(kind, v)
            if p is not None and not p.builtin:
                out[p.module] = p.record()
            elif p is None and kind == MODEL and ":" in v:  # a `package.module:factory` model from an installed package
                dist, version = _dist_of(v.partition(":")[0])
                if dist:
                    out[v] = {"module": v.partition(":")[0], "dist": dist, "version": version, "model": v}
    return list(out.values())


def check_available(records: list[dict], what: str, catalog: Catalog) -> None:
    """Refuse to load an artifact made with a plugin `catalog` has not loaded: name the plugin to install."""
    loaded = catalog.plugins
    for r in records:
        module, dist = r.get("module"), r.get("dist")
        if module in loaded or (dist and any(p.dist == dist for p in loaded.values())):
            continue
        if r.get("model") and importable(cast(str, module)):  # a `package.module:factory` model: importable is enough
            continue
        pin = f"=={r['version']}" if r.get("version") else ""
        fix = f"pip install {dist}{pin} (or --plugin {module})" if dist else f"load it with --plugin {module}"
        made = f"plugin '{module}'" + (f" ({dist} {r.get('version')})" if dist else "")
        raise PluginError(f"{what} was made with {made}, which is not loaded here: {fix}")


def importable(module: str) -> bool:
    """Whether `module`'s top-level package is installed, without importing anything (find_spec of a dotted name
    imports its parents: an artifact's text must not run code)."""
    import importlib.util
    try:
        return importlib.util.find_spec(module.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False
