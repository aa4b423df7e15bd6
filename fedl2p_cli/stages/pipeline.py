"""`fedl2p run PIPELINE.toml`: a pipeline file compiled once into a plan (validation is compilation: every section's
config built, so a typo in [personalize] costs no pretraining run and a refused file writes nothing), then the plan's
steps run in order, each reusing its artifact where its inputs are unchanged. `fedl2p report` asks the plan for ids."""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from .. import imports, plugins
from ..artifacts import Artifact, Store, StoreIndex, canonical_json
from ..catalog import Catalog
from ..core.config import flat_fields, key_name, option_name
from ..errors import FedL2PError
from ..runtime import Runtime
from ..stage_table import TABLE, Stage, Table
from . import pipeline_files
from .common import Progress
from .interface import Inputs, Planned, SectionFile, StageContext, StageModule, default_plan, run_stage

TOP_KEYS = ("store", "name", "description", "device", "plugins")  # a file's keys besides its stage sections
PLANS = ".pipelines.json"  # in a store: the ids each plan's last run made there (`fedl2p report` without plugins)


@dataclass
class StepResult:
    stage: str
    label: str
    artifact: Artifact
    reused: bool


@dataclass
class Pipeline:
    name: str
    sections: dict[str, Any]
    store: Store
    results: list[StepResult] = field(default_factory=list)
    device: str | None = None  # the file's `device`: where it computes unless --device / FEDL2P_DEVICE say otherwise
    plugins: list[str] = field(default_factory=list)  # the file's `plugins`: the command line loads them (cli/run.py)
    table: Table = TABLE  # the stages its sections name and its plan walks


@dataclass
class Run:
    """What the steps of one execution share: the store, the runtime, the artifacts made so far by step key."""
    store: Store
    runtime: Runtime
    progress: Callable[[], Progress]
    done: dict[str, Artifact] = field(default_factory=dict)

    def ids_of(self, keys: tuple[str, ...]) -> list[str]:
        """The ids of these steps, in plan order (a key ending in ":": every step so named; a step not in the plan:
        none)."""
        return [a.id for key in keys for k, a in self.done.items() if (k.startswith(key) if key.endswith(":") else k == key)]


@dataclass
class Step:
    """One artifact of the plan: made by `make(run, force)`, from the config of the file's `section`."""
    key: str  # unique in the plan; later steps find this one's artifact under it
    stage: str
    label: str
    section: str  # as the file spells it ([pretrain.partition], [[meta-train]]): what messages name
    config: type  # the section's config class: its options, named as keys in messages
    make: Callable[[Run, bool], tuple[Artifact, bool]]


@dataclass
class Plan:
    name: str
    store: Store
    steps: list[Step]
    key: str  # the resolved file's hash: the store records under it the ids this plan made
    table: Table = TABLE


# -- reading the file -------------------------------------------------------------------------------------------
def load(path: Path, store_override: Path | None = None, table: Table = TABLE) -> Pipeline:
    """The file with its `extends` chain applied and its top-level keys checked against `table`'s stages. Its
    `plugins` are named, not loaded: the command line loads them into its catalog (a report from the ids a run
    recorded needs none)."""
    data = pipeline_files.resolve(path)
    unknown = [k for k in data if k not in table.sections and k not in TOP_KEYS]
    if unknown:
        raise FedL2PError(f"pipeline {path}: unknown section '{unknown[0]}'; sections are: {', '.join(table.sections)}")
    for need in (s.name for s in table.rows if s.required):
        if need not in data:
            raise FedL2PError(f"pipeline {path} has no [{need}] section")
    root = store_override or Path(data.get("store", "artifacts"))
    mods = data.get("plugins", [])  # modules whose register(registry) adds the models, datasets and methods it names
    if not isinstance(mods, list) or not all(isinstance(m, str) for m in mods):
        raise FedL2PError(f"pipeline {path}: plugins must be a list of module names, got {mods!r}")
    if "device" in data:  # where this pipeline computes, unless --device / FEDL2P_DEVICE say otherwise
        if not isinstance(data["device"], str):
            raise FedL2PError(f"pipeline {path}: device must be a string such as \"cuda\", got {data['device']!r}")
        from .. import device
        device.parse(data["device"])  # a misspelt key is refused even where --device overrides it
    return Pipeline(data.get("name", path.stem), data, Store(root), device=data.get("device"), plugins=list(mods),
                    table=table)


def named_modules(p: Pipeline) -> tuple[str, ...]:
    """The modules of the `package.module:factory` models the file's sections name: the user's, which the command
    line allows (its runtime's `allow_import`)."""
    tables = [t for v in p.sections.values() for t in (v if isinstance(v, list) else [v]) if isinstance(t, dict)]
    return tuple(dict.fromkeys(m.partition(":")[0] for t in tables if isinstance(m := t.get("model"), str) and ":" in m))


# -- compiling ---------------------------------------------------------------------------------------------------
def compile(p: Pipeline, catalog: Catalog) -> Plan:
    """Every section's config built and validated against `catalog`, in the order its steps run: the stage table
    walked, each stage asked for its steps (its module's `plan`, else one step per table of its section;
    stages/interface.py)."""
    file = SectionFile(p.sections, p.name, catalog)
    steps: list[Step] = []
    for st in p.table.rows:
        if not st.section or st.module is None:
            continue
        module = st.module if isinstance(st.module, ModuleType) else imports.load(st.module, imports.Why.OWN)
        planned = module.plan(file) if hasattr(module, "plan") else default_plan(st, module, file)
        known = {s.key: s.stage for s in steps} | {x.key: st.name for x in planned}
        for x in planned:
            undeclared = undeclared_reads(st, x, known)
            if undeclared:
                raise FedL2PError(f"stage {st.name}: its step {x.key} reads {', '.join(undeclared)}, which its row's "
                                  f"parents {list(st.parents)} do not list (fedl2p_cli/stage_table.py)")
        steps += [_step(st.name, module, x) for x in planned]
    return Plan(p.name, p.store, steps, _key(p.sections), p.table)


def undeclared_reads(st: Stage, planned: Planned, known: dict[str, str]) -> list[str]:
    """The stages a planned step reads (its parents' step keys, by the stage each belongs to) that its row's `parents`
    do not list; its own stage's earlier steps (a partition excluding another) are its own."""
    def stages_of(key: str) -> set[str]:
        return {s for k, s in known.items() if (k.startswith(key) if key.endswith(":") else k == key)}
    read = {s for keys in planned.parents.values() for key in keys for s in stages_of(key)}
    return sorted(read - set(st.parents) - {st.name})


def _step(stage: str, module: StageModule, p: Planned) -> Step:
    """A planned step, made through the stage interface: its parents' ids from the steps run so far."""
    def make(r: Run, force: bool) -> tuple[Artifact, bool]:
        inputs = Inputs({name: tuple(r.ids_of(keys)) for name, keys in p.parents.items()})
        ctx = StageContext(r.store, r.runtime.replace(**p.runtime), force, r.progress())
        return run_stage(module, copy.deepcopy(p.config), inputs, ctx)  # the stage writes into its config
    return Step(p.key, stage, p.label, p.section, type(p.config), make)


def _key(sections: dict[str, Any]) -> str:
    """The plan's key: the resolved file's stage sections (a renamed copy, the same file with another store, device
    or plugins list makes the same artifacts: no artifact id holds those)."""
    same = {k: v for k, v in sections.items() if k not in TOP_KEYS}
    return hashlib.sha256(canonical_json(same).encode()).hexdigest()[:16]


# -- running -----------------------------------------------------------------------------------------------------
def execute(plan: Plan, force_from: str | None, progress: Callable[[], Progress],
            on_step: Callable[[StepResult], None] = lambda r: None, *, runtime: Runtime) -> list[StepResult]:
    """The plan's steps in order, each on `runtime` (a section's runtime keys added for its stage); the ids it made
    recorded in the store under the plan's key."""
    sections = plan.table.sections
    if force_from is not None and force_from not in sections:
        raise FedL2PError(f"--force takes a stage name: {', '.join(sections)}")
    forced = set(sections[sections.index(force_from):]) if force_from else set()
    run = Run(plan.store, runtime, progress)
    results = []
    for step in plan.steps:
        try:
            art, reused = step.make(run, step.stage in forced)
        except FedL2PError as e:  # the stages speak of the command's options; a pipeline file sets keys instead
            e.args = (in_file(str(e), step, plan.name),)
            raise e from None
        run.done[step.key] = art
        results.append(StepResult(step.stage, step.label, art, reused))
        on_step(results[-1])
    StoreIndex(plan.store.root, PLANS).put(plan.key, [[r.stage, r.label, r.artifact.id] for r in results])
    return results


def in_file(message: str, step: Step, name: str) -> str:
    """A stage's message with each of its options (--clients) named as the key of the step's section."""
    spelled = sorted(((option_name(f), key_name(f)) for f in flat_fields(step.config)), key=lambda o: -len(o[0]))
    named = False
    for flag, key in spelled:
        message, n = re.subn(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", key, message)
        named = named or n > 0
    if not named:
        return message
    extra = "; data_dir may also come from the FEDL2P_DATA variable" if "data_dir" in message else ""
    return f"pipeline {name}, [{step.section}]: {message}{extra}"


def run(p: Pipeline, force_from: str | None, progress: Callable[[], Progress],
        on_step: Callable[[StepResult], None] = lambda r: None, *, runtime: Runtime) -> list[StepResult]:
    """Compile the pipeline and execute its plan (`p.results`: what it made)."""
    results = execute(compile(p, plugins.of(runtime)), force_from, progress, on_step, runtime=runtime)
    p.results.extend(results)
    return results


def recorded(p: Pipeline) -> list[tuple[str, str, str]] | None:
    """(stage, label, id) of each step of this pipeline's last run in its store, if every one of them is still there
    (None otherwise). Read without compiling: the plugins the pipeline names need not be installed."""
    steps = StoreIndex(p.store.root, PLANS).get(_key(p.sections))
    if not isinstance(steps, list) or not steps:
        return None
    rows = [(str(a), str(b), str(c)) for a, b, c in steps]
    return rows if all(p.store.exists(stage, aid) for stage, _, aid in rows) else None
