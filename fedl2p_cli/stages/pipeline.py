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
from typing import Any

from .. import methods
from ..artifacts import Artifact, Store, StoreIndex, canonical_json
from ..core.config import ConfigError, flat_fields, from_flat, key_name, option_name, validate
from ..errors import FedL2PError
from ..runtime import Runtime, round_options
from ..stage_table import SECTIONS, STAGES
from . import analyze, meta_train, partition, personalize, pfl, pipeline_files, pretrain, stats
from .common import Progress

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


@dataclass
class Run:
    """What the steps of one execution share: the store, the runtime, the artifacts made so far by step key."""
    store: Store
    runtime: Runtime
    progress: Callable[[], Progress]
    done: dict[str, Artifact] = field(default_factory=dict)

    def ids(self, prefix: str) -> list[str]:
        return [a.id for k, a in self.done.items() if k.startswith(prefix)]


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


# -- building configs from sections ---------------------------------------------------------------------------
def _make(cls: type, section: str, values: dict, name: str) -> Any:
    """A section's config: its keys are the config's fields, nested configs' fields among them (flat_fields)."""
    names = {f.name for f in flat_fields(cls)}
    unknown = [k for k in values if k not in names]
    if unknown:
        raise FedL2PError(f"pipeline {name}: unknown key '{unknown[0]}' in [{section}] (known: {', '.join(sorted(names))})")
    try:
        cfg = from_flat(cls, values)
        validate(cfg, key_name)
    except (TypeError, ConfigError) as e:
        raise FedL2PError(f"pipeline {name}: [{section}] {e}") from None
    return cfg


def _runtime(values: dict, section: str, name: str, keys: tuple[str, ...] | None = None) -> tuple[dict, dict]:
    """A section of a stage with rounds: its settings, and its runtime keys (`keys`, default: workers, engine, the
    failure policy; never part of an artifact's id), checked here and applied over the command's runtime when the
    step runs."""
    own = {k: values[k] for k in (round_options() if keys is None else keys) if k in values}
    try:
        validate(Runtime().replace(**own), key_name)
    except (TypeError, ConfigError) as e:
        raise FedL2PError(f"pipeline {name}: [{section}] {e}") from None
    return {k: v for k, v in values.items() if k not in own}, own


def _table(value: Any, section: str, name: str) -> dict:
    if not isinstance(value, dict):
        raise FedL2PError(f"pipeline {name}: [{section}] must be a table of settings, got {value!r}")
    return dict(value)


def _tables(value: Any, section: str, name: str) -> list[dict]:
    """A repeatable section ([[meta-train]], [[pfl]]): one table or a list of tables."""
    values = [value] if isinstance(value, dict) else value if isinstance(value, list) else [value]
    return [_table(v, section, name) for v in values]


# -- reading the file -------------------------------------------------------------------------------------------
def load(path: Path, store_override: Path | None = None, plugins: bool = True) -> Pipeline:
    """The file with its `extends` chain applied and its top-level keys checked; with `plugins`, its plugins loaded
    (a report from the ids a run recorded needs none)."""
    data = pipeline_files.resolve(path)
    unknown = [k for k in data if k not in SECTIONS and k not in TOP_KEYS]
    if unknown:
        raise FedL2PError(f"pipeline {path}: unknown section '{unknown[0]}'; sections are: {', '.join(SECTIONS)}")
    for need in (s.name for s in STAGES if s.required):
        if need not in data:
            raise FedL2PError(f"pipeline {path} has no [{need}] section")
    root = store_override or Path(data.get("store", "artifacts"))
    if "plugins" in data:  # modules whose register(registry) adds the models, datasets and methods its sections name
        mods = data["plugins"]
        if not isinstance(mods, list) or not all(isinstance(m, str) for m in mods):
            raise FedL2PError(f"pipeline {path}: plugins must be a list of module names, got {mods!r}")
        if plugins:
            from .. import plugins as registry
            registry.load(mods, f"pipeline {path}")
    if "device" in data:  # where this pipeline computes, unless --device / FEDL2P_DEVICE say otherwise
        if not isinstance(data["device"], str):
            raise FedL2PError(f"pipeline {path}: device must be a string such as \"cuda\", got {data['device']!r}")
        from .. import device
        device.parse(data["device"])  # a misspelt key is refused even where --device overrides it
    return Pipeline(data.get("name", path.stem), data, Store(root), device=data.get("device"))


# -- compiling ---------------------------------------------------------------------------------------------------
def compile(p: Pipeline) -> Plan:
    """Every section's config built and validated, in the order its steps run."""
    s, name = p.sections, p.name
    pre_sec, pre_own = _runtime(_table(s["pretrain"], "pretrain", name), "pretrain", name)
    own = pre_sec.pop("partition", None)  # [pretrain.partition]: the model is pretrained on other clients
    steps = []
    if own is not None:
        cfg = _make(partition.PartitionConfig, "pretrain.partition", _table(own, "pretrain.partition", name), name)
        steps.append(Step("pretrain.partition", "partition", "partition (pretraining clients)", "pretrain.partition",
                          partition.PartitionConfig, _partition(cfg, None)))
    part = _table(s["partition"], "partition", name)
    exclude = part.get("exclude") == "pretrain"  # the clients get no image the model was pretrained on
    if exclude and own is None:
        raise FedL2PError(f"pipeline {name}: exclude = \"pretrain\" needs a [pretrain.partition] section")
    cfg = _make(partition.PartitionConfig, "partition", part, name)
    steps.append(Step("partition", "partition", "partition", "partition", partition.PartitionConfig,
                      _partition(cfg, "pretrain.partition" if exclude else None)))
    cfg = _make(pretrain.PretrainConfig, "pretrain", pre_sec, name)
    steps.append(Step("pretrain", "pretrain", "pretrain", "pretrain", pretrain.PretrainConfig, _pretrain(cfg, pre_own)))
    cfg = _make(stats.StatsConfig, "stats", _table(s.get("stats", {}), "stats", name), name)
    steps.append(Step("stats", "stats", "stats", "stats", stats.StatsConfig, lambda r, f, cfg=cfg: stats.run(  # type: ignore[misc]  # defaults bind the loop's values
        copy.deepcopy(cfg), r.store, r.done["partition"].id, r.done["pretrain"].id, f, r.progress(), runtime=r.runtime)))
    for i, m in enumerate(_tables(s.get("meta-train", []), "meta-train", name)):
        values, rt = _runtime(m, "meta-train", name)
        cfg = _make(meta_train.MetaTrainConfig, "meta-train", values, name)
        steps.append(Step(f"meta-train:{i}", "meta-train", cfg.variant(), "meta-train", meta_train.MetaTrainConfig,
                          _meta_train(cfg, rt)))
    for i, t in enumerate(_tables(s.get("pfl", []), "pfl", name)):  # the other personalised-FL systems, same clients
        values, rt = _runtime(t, "pfl", name)
        cfg = _make(pfl.PFLConfig, "pfl", values, name)
        pfl.check(cfg)
        steps.append(Step(f"pfl:{i}", "pfl", cfg.algo, "pfl", pfl.PFLConfig, lambda r, f, cfg=cfg, rt=rt: pfl.run(  # type: ignore[misc]  # defaults bind the loop's values
            copy.deepcopy(cfg), r.store, r.done["partition"].id, f, True, r.progress(), runtime=r.runtime.replace(**rt))))
    if "personalize" in s:
        steps += _personalize(s, name)
    else:
        _analysis(s, name)  # checked even where no pool is personalised for it to analyse
    return Plan(p.name, p.store, steps, _key(s))


def _key(sections: dict[str, Any]) -> str:
    """The plan's key: the resolved file's stage sections (a renamed copy, the same file with another store, device
    or plugins list makes the same artifacts: no artifact id holds those)."""
    same = {k: v for k, v in sections.items() if k not in TOP_KEYS}
    return hashlib.sha256(canonical_json(same).encode()).hexdigest()[:16]


def _partition(cfg: Any, exclude_step: str | None) -> Callable[[Run, bool], tuple[Artifact, bool]]:
    def make(r: Run, force: bool) -> tuple[Artifact, bool]:
        c = copy.deepcopy(cfg)  # the stage writes into its config (exclude: the id it resolved)
        if exclude_step is not None:
            c.exclude = r.done[exclude_step].id
        return partition.run(c, r.store, force, plot=True, runtime=r.runtime)
    return make


def _pretrain(cfg: Any, own: dict) -> Callable[[Run, bool], tuple[Artifact, bool]]:
    def make(r: Run, force: bool) -> tuple[Artifact, bool]:
        part = r.done.get("pretrain.partition") or r.done["partition"]
        return pretrain.run(copy.deepcopy(cfg), r.store, part.id, force, True, r.progress(), runtime=r.runtime.replace(**own))
    return make


def _meta_train(cfg: Any, own: dict) -> Callable[[Run, bool], tuple[Artifact, bool]]:
    def make(r: Run, force: bool) -> tuple[Artifact, bool]:
        return meta_train.run(copy.deepcopy(cfg), r.store, r.done["pretrain"].id, r.done["stats"].id, force, True,
                              r.progress(), runtime=r.runtime.replace(**own))
    return make


def _personalize(s: dict[str, Any], name: str) -> list[Step]:
    """A personalize step per pool, and the analysis after the pool it names."""
    pers, own = _runtime(_table(s["personalize"], "personalize", name), "personalize", name, PERSONALIZE_RUNTIME)
    pools = pers.pop("pools", ["seen"])
    if not isinstance(pools, list) or not pools or any(x not in ("seen", "unseen") for x in pools):
        raise FedL2PError(f"pipeline {name}: [personalize] pools must be a list of \"seen\" and/or \"unseen\", got {pools!r}")
    handmade = pers.pop("methods", list(methods.baselines()))
    allowed = methods.handmade() + methods.names(methods.Checked)  # a checked row reads the [[meta-train]] runs
    bad = [m for m in handmade if m not in allowed] if isinstance(handmade, list) else [handmade]
    if bad:
        raise FedL2PError(f"pipeline {name}: [personalize] methods lists '{bad[0]}'; hand-made and checked methods "
                          f"are: {', '.join(allowed)} (meta-net variants come from [[meta-train]])")
    analysis = _table(s["analyze"], "analyze", name) if "analyze" in s else None
    acfg = _analysis(s, name)
    steps = []
    for pool in pools:
        cfg = _make(personalize.PersonalizeConfig, "personalize", pers | {"unseen": pool == "unseen", "methods": list(handmade)},
                    name)
        steps.append(Step(f"personalize:{pool}", "personalize", pool, "personalize", personalize.PersonalizeConfig,
                          _personalize_pool(cfg, pool, own)))
        if acfg is not None and analysis is not None and pool == analysis.get("pool", pools[-1]):
            steps.append(Step(f"analyze:{pool}", "analyze", f"clusters ({pool})", "analyze", analyze.ClustersConfig,
                              lambda r, f, pool=pool: analyze.run(copy.deepcopy(acfg), r.store,  # type: ignore[misc]  # defaults bind the loop's values
                                                                  r.done[f"personalize:{pool}"].id, f, r.runtime)))
    return steps


def _analysis(s: dict[str, Any], name: str) -> Any:
    if "analyze" not in s:
        return None
    values = {k: v for k, v in _table(s["analyze"], "analyze", name).items() if k != "pool"}
    return _make(analyze.ClustersConfig, "analyze", values, name)


PERSONALIZE_RUNTIME = ("client_batch",)  # [personalize]'s runtime keys: how many clients' fine-tunings at once


def _personalize_pool(cfg: Any, pool: str, own: dict) -> Callable[[Run, bool], tuple[Artifact, bool]]:
    def make(r: Run, force: bool) -> tuple[Artifact, bool]:
        metas = [i for i in r.ids("meta-train:")
                 if meta_train.method_of(r.store.load("meta-train", i, verify=False)).supports(pool)]
        return personalize.run(copy.deepcopy(cfg), r.store, r.done["pretrain"].id, r.done["stats"].id, metas, force,
                               r.progress(), r.ids("pfl:"), runtime=r.runtime.replace(**own))
    return make


# -- running -----------------------------------------------------------------------------------------------------
def execute(plan: Plan, force_from: str | None, progress: Callable[[], Progress],
            on_step: Callable[[StepResult], None] = lambda r: None, runtime: Runtime | None = None) -> list[StepResult]:
    """The plan's steps in order, each on `runtime` (a section's runtime keys added for its stage); the ids it made
    recorded in the store under the plan's key."""
    if force_from is not None and force_from not in SECTIONS:
        raise FedL2PError(f"--force takes a stage name: {', '.join(SECTIONS)}")
    forced = set(SECTIONS[SECTIONS.index(force_from):]) if force_from else set()
    run = Run(plan.store, runtime or Runtime(), progress)
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
        on_step: Callable[[StepResult], None] = lambda r: None, runtime: Runtime | None = None) -> list[StepResult]:
    """Compile the pipeline and execute its plan (`p.results`: what it made)."""
    results = execute(compile(p), force_from, progress, on_step, runtime)
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
