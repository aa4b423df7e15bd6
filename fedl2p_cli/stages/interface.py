"""The one interface every stage runs behind: `execute(cfg, inputs, ctx)`, and the plan of steps a pipeline file's
section compiles to.

A stage module (the stage table's `module`) provides:
- `execute(cfg, inputs: Inputs, ctx: StageContext) -> (Artifact, reused)`: one artifact from its config, the
  artifacts it reads (its parents, by row: `inputs.get(STATS)` is the stats artifact and, through the stats row's
  `reader`, the table it holds, typed: `rows.py` names what each reader returns; a name known only at run time reads
  untyped) and what every stage shares (store, runtime, force, progress);
- optionally `plan(file: SectionFile) -> list[Planned]`: the steps its section(s) compile to, where the default
  (one step per table of its section, parents from the table's `parents`) does not fit;
- optionally `label(cfg) -> str` (a step's short name; default: the stage's name) and `check_planned(cfg, catalog)` (a
  check that needs more than the config's own validation, run at compile time against the file's catalog).

`pipeline.compile` walks the stage table and asks each stage for its steps: adding a stage is its module and one
table row (and its config class, beside the others in configs.py). A stage never imports another stage's module nor
names another stage to the store: what it reads comes through `Inputs` and the rows' readers (tests/test_layout.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Generic, Protocol, TypeVar, cast, overload

from .. import imports, plugins
from ..artifacts import Artifact, Store
from ..catalog import Catalog
from ..core.config import ConfigError, flat_fields, from_flat, key_name, validate
from ..errors import ArtifactError, FedL2PError
from ..runtime import Runtime, round_options
from ..stage_table import Stage, stage
from .common import Progress
from .rows import StageKey

Reader = Callable[[Artifact, Catalog], Any]  # a row's reader: an artifact, and the catalog of the stage that reads it
T = TypeVar("T")
U = TypeVar("U")
V = TypeVar("V", covariant=True)  # a Read of a StatsTable is a Read of an object (what a bare name reads)


def reader(name: str) -> Reader:
    """The stage's reader (its row's `reader`): an artifact of it and the reading stage's catalog (what a stored
    model, head or system is looked up in) -> what the stage wrote."""
    target = stage(name).reader
    if target is None:
        raise FedL2PError(f"stage {name} has no reader: nothing reads its artifacts")
    return imports.load(target, imports.Why.OWN)  # type: ignore[no-any-return]  # a reader, by the table


@dataclass
class Read(Generic[V]):
    """One artifact a step reads, and (on first use) what its stage wrote, by its row's reader given `catalog`: a `V`
    (read by a `StageKey[V]`; by a bare name, an `object`: its artifact is known, its value's type is not)."""
    artifact: Artifact
    store: Store
    catalog: Catalog
    plugins: bool = True  # its own parents are loaded checking their plugins (a report reads files: it needs none)

    @cached_property
    def value(self) -> V:
        return cast(V, reader(self.artifact.stage)(self.artifact, self.catalog))  # the row's reader returns its V

    @overload
    def parent(self, key: StageKey[U], label: str | None = None) -> Read[U]: ...
    @overload
    def parent(self, key: str, label: str | None = None) -> Read[object]: ...

    def parent(self, key: str, label: str | None = None) -> Read[object]:
        """One of its own parents (a grandparent of the step), by its key in the artifact's parents (`label`: the
        part after the stage's name, `meta-train:VARIANT`)."""
        key = key if label is None else f"{key}:{label}"
        return reading(self.store, key.split(":")[0], self.artifact.parents[key], self.catalog, plugins=self.plugins)


@overload
def reading(store: Store, name: StageKey[T], ref: str | None, catalog: Catalog, verify: bool = True,
            plugins: bool = True) -> Read[T]: ...
@overload
def reading(store: Store, name: str, ref: str | None, catalog: Catalog, verify: bool = True,
            plugins: bool = True) -> Read[object]: ...


def reading(store: Store, name: str, ref: str | None, catalog: Catalog, verify: bool = True,
            plugins: bool = True) -> Read[object]:
    """The `name` stage's artifact `ref` (an id or a prefix; None: its newest), to be read by its row's reader with
    `catalog` (a stage's own; code outside the stages, a test or a bench, hands its own)."""
    return Read(store.load(name, ref, verify=verify, catalog=catalog if plugins else None), store, catalog, plugins)


@dataclass(frozen=True)
class Inputs:
    """The artifacts a step reads: ids by parent name (a stage's name, or a name its plan gives), in plan order, and
    the store they are read from and the catalog their readers look up in (`run_stage` binds both: the stage's)."""
    ids: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    store: Store | None = None
    catalog: Catalog | None = None

    @overload
    def get(self, name: StageKey[T], default: str | None = None, *, verify: bool = True) -> Read[T]: ...
    @overload
    def get(self, name: str, default: str | None = None, *, stage: StageKey[T], verify: bool = True) -> Read[T]: ...
    @overload
    def get(self, name: str, default: str | None = None, stage: str | None = None, verify: bool = True) -> Read[object]: ...

    def get(self, name: str, default: str | None = None, stage: str | None = None, verify: bool = True) -> Read[object]:
        """The one artifact given as `name` (a parent of stage `stage`, default `name`), else `default` (an id the
        stage derives, such as a parent's own parent), else the stage's newest."""
        return self._read(stage or name, self.one(name) or default, verify)

    @overload
    def every(self, name: StageKey[T], stage: None = None, verify: bool = True) -> list[Read[T]]: ...
    @overload
    def every(self, name: str, stage: str | None = None, verify: bool = True) -> list[Read[object]]: ...

    def every(self, name: str, stage: str | None = None, verify: bool = True) -> Sequence[Read[object]]:
        """Every artifact given as `name`, in plan order."""
        return [self._read(stage or name, i, verify) for i in self.many(name)]

    @overload
    def made_from(self, name: StageKey[T], parent: str, pid: str, what: str) -> Read[T]: ...
    @overload
    def made_from(self, name: str, parent: str, pid: str, what: str) -> Read[object]: ...

    def made_from(self, name: str, parent: str, pid: str, what: str) -> Read[object]:
        """`name` among the inputs, which must have been made from the `parent` artifact `pid` (a `what`; default: the
        newest so made); one made from another is refused with one line."""
        ref = self.one(name)
        if ref is None:
            hit = self._store().newest(name, lambda a: a.parents.get(parent) == pid)
            if hit is None:
                raise ArtifactError(f"no {name} artifact for {what} {pid}; run `fedl2p {stage(name).command} --{parent} {pid}`")
            ref = hit.id
        got = self._read(name, ref, True)
        if got.artifact.parents.get(parent) != pid:
            raise ArtifactError(f"{name} {got.artifact.id} was computed for {what} {got.artifact.parents.get(parent)}, not {pid}")
        return got

    @overload
    def at(self, name: StageKey[T], ref: str, verify: bool = True) -> Read[T]: ...
    @overload
    def at(self, name: str, ref: str, verify: bool = True) -> Read[object]: ...

    def at(self, name: str, ref: str, verify: bool = True) -> Read[object]:
        """The `name` stage's artifact `ref`, which the stage found itself (a `newest` match, an id a row names)."""
        return self._read(name, ref, verify)

    @overload
    def newest(self, name: StageKey[T], where: Callable[[Artifact], bool], verify: bool = True) -> Read[T] | None: ...
    @overload
    def newest(self, name: str, where: Callable[[Artifact], bool], verify: bool = True) -> Read[object] | None: ...

    def newest(self, name: str, where: Callable[[Artifact], bool], verify: bool = True) -> Read[object] | None:
        """The newest artifact of the `name` stage that satisfies `where` (None: none does)."""
        hit = self._store().newest(name, where)
        return None if hit is None else self._read(name, hit.id, verify)

    def stored(self, name: str) -> Iterator[Artifact]:
        """Every artifact of the `name` stage in the store (unverified: for messages and choices)."""
        return self._store().iter(name)

    def bound(self, store: Store, catalog: Catalog) -> Inputs:
        """These inputs read from `store` with `catalog`: what `run_stage` hands a stage, and what a worker's or a
        site's builder reads its parents' ids through (it runs outside `run_stage`, in its own process)."""
        return replace(self, store=store, catalog=catalog)

    def _store(self) -> Store:
        if self.store is None:
            raise FedL2PError("Inputs are read from a store: run the stage through run_stage")
        return self.store

    def _read(self, name: str, ref: str | None, verify: bool) -> Read[object]:
        if self.catalog is None:
            raise FedL2PError("Inputs are read with the stage's catalog: run the stage through run_stage")
        return reading(self._store(), name, ref, self.catalog, verify)

    def one(self, name: str) -> str | None:
        """The one artifact of that parent (None: none given; the stage then takes the newest or its default)."""
        got = self.ids.get(name, ())
        return got[-1] if got else None

    def many(self, name: str) -> list[str]:
        return list(self.ids.get(name, ()))

    @classmethod
    def given(cls, ids: Mapping[str, str | list[str] | None]) -> Inputs:
        """Inputs from what a command line gave: an id (prefix), a list of them, or None (not given)."""
        return cls({k: (v,) if isinstance(v, str) else tuple(v) for k, v in ids.items() if v})


@dataclass(frozen=True)
class StageContext:
    """What every stage run shares. The pieces it looks up are the catalog its runtime carries: the command line
    (cli/options.py, cli/run.py) puts it there; a stage never changes it."""
    store: Store
    runtime: Runtime = field(default_factory=Runtime)
    force: bool = False
    progress: Progress | None = None
    resume: bool = True  # a stage with rounds continues from its round checkpoint
    plot: bool = True  # a stage that draws writes its plots

    @property
    def catalog(self) -> Catalog:
        """The runtime's catalog, allowing the modules the runtime names; a runtime that carries none is refused
        (`plugins.NoCatalog`): whoever starts the run (the command line, a test, a library call) hands one over."""
        return plugins.of(self.runtime)


class StageModule(Protocol):
    def execute(self, cfg: Any, inputs: Inputs, ctx: StageContext) -> tuple[Artifact, bool]: ...


def run_stage(module: StageModule, cfg: Any, inputs: Inputs, ctx: StageContext) -> tuple[Artifact, bool]:
    """A stage run: its module's `execute`, handed `ctx.catalog`, and its inputs bound to the store and that catalog.
    The catalog is also put in place for a plugin's code that is handed none (`api.build_model` without
    `catalog=`): the one lookup below a stage that falls back on `plugins.current()` (tests/test_layout.py LOOKUPS)."""
    catalog = ctx.catalog
    with plugins.using(catalog):
        return module.execute(cfg, inputs.bound(ctx.store, catalog), ctx)


@dataclass
class Planned:
    """One step of a plan, as a stage's plan gives it."""
    key: str  # unique in the plan; later steps name it among their parents
    label: str
    section: str  # as the file spells it ([pretrain.partition], [[meta-train]]): what messages name
    config: Any  # the built, validated config
    parents: dict[str, tuple[str, ...]]  # parent name -> the steps' keys (a key ending in ":": every step so named)
    runtime: dict[str, Any] = field(default_factory=dict)  # the section's runtime keys, over the command's runtime


@dataclass(frozen=True)
class SectionFile:
    """A pipeline file's sections (its `extends` applied) and its name, as a stage's plan reads them, with the
    catalog the file is compiled against (the methods a [personalize] section may list)."""
    sections: dict[str, Any]
    name: str
    catalog: Catalog

    def table(self, section: str, value: Any = None) -> dict:
        """A section that must be one table of settings."""
        value = self.sections.get(section, {}) if value is None else value
        if not isinstance(value, dict):
            raise FedL2PError(f"pipeline {self.name}: [{section}] must be a table of settings, got {value!r}")
        return dict(value)

    def tables(self, section: str) -> list[dict]:
        """A repeatable section ([[meta-train]], [[pfl]]): one table or a list of tables."""
        value = self.sections.get(section, [])
        values = [value] if isinstance(value, dict) else value if isinstance(value, list) else [value]
        return [self.table(section, v) for v in values]

    def config(self, cls: type, section: str, values: dict, also: tuple[str, ...] = ()) -> Any:
        """A section's config: its keys are the config's fields, nested configs' fields among them (flat_fields).
        `also`: the section's other keys (runtime keys, a stage's own), taken out of `values` by the caller and
        named among the known ones when a key is unknown."""
        names = {f.name for f in flat_fields(cls)}
        presets = getattr(cls, "PRESETS", None)
        if presets and "preset" in values:  # a named set of the section's keys, its own keys over it
            name = values.pop("preset")
            if name not in presets:
                raise FedL2PError(f"pipeline {self.name}: [{section}] unknown preset {name!r}; choose one of: "
                                  f"{', '.join(presets)}")
            values = presets[name] | values
        also = (*also, "preset") if presets else also
        unknown = [k for k in values if k not in names]
        if unknown:
            raise FedL2PError(f"pipeline {self.name}: unknown key '{unknown[0]}' in [{section}] (known: "
                              f"{', '.join(sorted(names | set(also)))})")
        try:
            cfg = from_flat(cls, values)
            validate(cfg, key_name)
        except (TypeError, ConfigError) as e:
            raise FedL2PError(f"pipeline {self.name}: [{section}] {e}") from None
        return cfg

    def runtime(self, values: dict, section: str, keys: tuple[str, ...]) -> tuple[dict, dict]:
        """A section's settings, and its runtime keys (`keys`; never part of an artifact's id), checked here and
        applied over the command's runtime when the step runs."""
        own = {k: values[k] for k in keys if k in values}
        try:
            validate(Runtime().replace(**own), key_name)
        except (TypeError, ConfigError) as e:
            raise FedL2PError(f"pipeline {self.name}: [{section}] {e}") from None
        return {k: v for k, v in values.items() if k not in own}, own


def runtime_keys(stage: Stage, module: Any) -> tuple[str, ...]:
    """A section's runtime keys: the module's `RUNTIME_KEYS`, else the round options for a stage with rounds."""
    return getattr(module, "RUNTIME_KEYS", round_options() if stage.trains else ())


def parents_of(stage: Stage) -> dict[str, tuple[str, ...]]:
    """The table's parents as step keys: a repeated stage's every step, another's one."""
    from ..stage_table import stage as stage_of
    return {p: (f"{p}:",) if stage_of(p).repeated else (p,) for p in stage.parents}


def default_plan(stage: Stage, module: Any, file: SectionFile) -> list[Planned]:
    """One step per table of the stage's section (none where the file has none, unless the stage is `implied`)."""
    if stage.name not in file.sections and not stage.implied:
        return []
    tables = file.tables(stage.name) if stage.repeated else [file.table(stage.name)]
    cls = stage.configs[""]
    out = []
    keys = runtime_keys(stage, module)
    for i, t in enumerate(tables):
        values, own = file.runtime(t, stage.name, keys)
        cfg = file.config(cls, stage.name, values, also=keys)
        if hasattr(module, "check_planned"):
            module.check_planned(cfg, file.catalog)
        label = module.label(cfg) if hasattr(module, "label") else stage.name
        out.append(Planned(f"{stage.name}:{i}" if stage.repeated else stage.name, label, stage.name, cfg,
                           parents_of(stage), own))
    return out
