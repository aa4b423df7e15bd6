"""`fedl2p run PIPELINE.toml`: the stages in order, reusing every artifact whose inputs are unchanged."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import methods
from ..artifacts import Artifact, Store
from ..core.config import ConfigError, flat_fields, from_flat, key_name, validate
from ..errors import DataError, FedL2PError
from ..runtime import Runtime, round_options
from . import analyze, meta_train, partition, personalize, pfl, pipeline_files, pretrain, stats
from .common import Progress

ORDER = ("partition", "pretrain", "stats", "meta-train", "pfl", "personalize", "analyze")


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


def _runtime(base: Runtime, values: dict, section: str, name: str) -> tuple[dict, Runtime]:
    """A section of a stage with rounds: its settings, and `base` with the section's runtime keys (workers, engine,
    the failure policy: never part of an artifact's id)."""
    own = {k: values[k] for k in round_options() if k in values}
    try:
        rt = base.replace(**own)
        validate(rt, key_name)
    except (TypeError, ConfigError) as e:
        raise FedL2PError(f"pipeline {name}: [{section}] {e}") from None
    return {k: v for k, v in values.items() if k not in own}, rt


def _table(value: Any, section: str, name: str) -> dict:
    if not isinstance(value, dict):
        raise FedL2PError(f"pipeline {name}: [{section}] must be a table of settings, got {value!r}")
    return value


def check_sections(p: Pipeline) -> None:
    """Every section's config built and validated before the first stage runs: a typo in [personalize] must not
    cost a pretraining run, and a refused pipeline writes nothing."""
    s, name = p.sections, p.name
    pre, _ = _runtime(Runtime(), dict(_table(s["pretrain"], "pretrain", name)), "pretrain", name)
    own = pre.pop("partition", None)
    if own is not None:
        _make(partition.PartitionConfig, "pretrain.partition", _table(own, "pretrain.partition", name), name)
    part = dict(_table(s["partition"], "partition", name))
    if part.get("exclude") == "pretrain" and own is None:
        raise FedL2PError(f"pipeline {name}: exclude = \"pretrain\" needs a [pretrain.partition] section")
    _make(partition.PartitionConfig, "partition", part, name)
    _make(pretrain.PretrainConfig, "pretrain", pre, name)
    _make(stats.StatsConfig, "stats", _table(s.get("stats", {}), "stats", name), name)
    for m in _tables(s.get("meta-train", []), "meta-train", name):
        _meta_cfg(_runtime(Runtime(), m, "meta-train", name)[0], name)
    for t in _tables(s.get("pfl", []), "pfl", name):
        pfl.check(_make(pfl.PFLConfig, "pfl", t, name))
    if "personalize" in s:
        pers = dict(_table(s["personalize"], "personalize", name))
        pools = pers.pop("pools", ["seen"])
        if not isinstance(pools, list) or not pools or any(x not in ("seen", "unseen") for x in pools):
            raise FedL2PError(f"pipeline {name}: [personalize] pools must be a list of \"seen\" and/or \"unseen\", got {pools!r}")
        pers.pop("methods", None)  # checked against the hand-made methods when the stage runs
        _make(personalize.PersonalizeConfig, "personalize", pers, name)
    if "analyze" in s:
        _make(analyze.ClustersConfig, "analyze", {k: v for k, v in _table(s["analyze"], "analyze", name).items() if k != "pool"}, name)


def _tables(value: Any, section: str, name: str) -> list[dict]:
    """A repeatable section ([[meta-train]], [[pfl]]): one table or a list of tables."""
    values = [value] if isinstance(value, dict) else value if isinstance(value, list) else [value]
    return [_table(v, section, name) for v in values]


def load(path: Path, store_override: Path | None = None) -> Pipeline:
    data = pipeline_files.resolve(path)  # its `extends` chain applied
    unknown = [k for k in data if k not in ORDER and k not in ("store", "name", "description", "device", "plugins")]
    if unknown:
        raise FedL2PError(f"pipeline {path}: unknown section '{unknown[0]}'; sections are: {', '.join(ORDER)}")
    for need in ("partition", "pretrain"):
        if need not in data:
            raise FedL2PError(f"pipeline {path} has no [{need}] section")
    root = store_override or Path(data.get("store", "artifacts"))
    if "plugins" in data:  # modules whose register(registry) adds the models, datasets and methods its sections name
        mods = data["plugins"]
        if not isinstance(mods, list) or not all(isinstance(m, str) for m in mods):
            raise FedL2PError(f"pipeline {path}: plugins must be a list of module names, got {mods!r}")
        from .. import plugins
        plugins.load(mods, f"pipeline {path}")
    if "device" in data:  # where this pipeline computes, unless --device / FEDL2P_DEVICE say otherwise
        if not isinstance(data["device"], str):
            raise FedL2PError(f"pipeline {path}: device must be a string such as \"cuda\", got {data['device']!r}")
        from .. import device
        device.parse(data["device"])  # a misspelt key is refused even where --device overrides it
    return Pipeline(data.get("name", path.stem), data, Store(root), device=data.get("device"))


def _meta_cfg(values: dict, name: str) -> meta_train.MetaTrainConfig:
    return _make(meta_train.MetaTrainConfig, "meta-train", values, name)


def run(p: Pipeline, force_from: str | None, progress: Callable[[], Progress],
        on_step: Callable[[StepResult], None] = lambda r: None, runtime: Runtime | None = None) -> list[StepResult]:
    """The stages in order, each on `runtime` (a section's runtime keys added for its stage)."""
    base = runtime or Runtime()
    if force_from is not None and force_from not in ORDER:
        raise FedL2PError(f"--force takes a stage name: {', '.join(ORDER)}")
    forced = set(ORDER[ORDER.index(force_from):]) if force_from else set()
    check_sections(p)
    s, name = p.sections, p.name

    def step(stage: str, label: str, fn: Callable[[bool], tuple[Artifact, bool]]) -> Artifact:
        try:
            art, reused = fn(stage in forced)
        except DataError as e:  # the data layer speaks of the CLI's flag; a pipeline file sets a key instead
            where = 'pretrain.partition' if 'pretraining' in label else stage
            raise DataError(str(e).replace("--data-dir", f"data_dir (a key of [{where}] in {name}, or "
                                           "the FEDL2P_DATA variable)")) from None
        r = StepResult(stage, label, art, reused)
        p.results.append(r)
        on_step(r)
        return art

    pre_sec, pre_rt = _runtime(base, dict(s["pretrain"]), "pretrain", name)
    own = pre_sec.pop("partition", None)  # [pretrain.partition]: the model is pretrained on other clients
    pre_part = None
    if own is not None:
        pre_part = step("partition", "partition (pretraining clients)", lambda f: partition.run(
            _make(partition.PartitionConfig, "pretrain.partition", own, name), p.store, f, plot=True))
    part_sec = dict(s["partition"])
    if part_sec.get("exclude") == "pretrain":  # the clients get no image the model was pretrained on (checked: it has one)
        part_sec["exclude"] = pre_part.id
    part = step("partition", "partition", lambda f: partition.run(_make(partition.PartitionConfig, "partition", part_sec, name),
                                                                  p.store, f, plot=True))
    pre = step("pretrain", "pretrain", lambda f: pretrain.run(_make(pretrain.PretrainConfig, "pretrain", pre_sec, name),
                                                               p.store, (pre_part or part).id, f, True, progress(),
                                                               runtime=pre_rt))
    st = step("stats", "stats", lambda f: stats.run(_make(stats.StatsConfig, "stats", s.get("stats", {}), name), p.store,
                                                     part.id, pre.id, f, progress(), runtime=base))
    meta_ids = []
    for m in _tables(s.get("meta-train", []), "meta-train", name):
        m, rt = _runtime(base, m, "meta-train", name)
        cfg = _meta_cfg(m, name)
        art = step("meta-train", cfg.variant(), lambda f, cfg=cfg, rt=rt: meta_train.run(cfg, p.store, pre.id, st.id, f, True,
                                                                                         progress(), runtime=rt))
        meta_ids.append(art.id)
    pfl_ids = []
    for t in _tables(s.get("pfl", []), "pfl", name):  # the other personalised-FL systems, on the same clients
        cfg = _make(pfl.PFLConfig, "pfl", t, name)
        art = step("pfl", cfg.algo, lambda f, cfg=cfg: pfl.run(cfg, p.store, part.id, f, True, progress(), runtime=base))
        pfl_ids.append(art.id)
    if "personalize" not in s:
        return p.results
    pers = dict(s["personalize"])
    pools = pers.pop("pools", ["seen"])
    handmade = pers.pop("methods", list(methods.baselines()))
    bad = [m for m in handmade if m not in methods.handmade()] if isinstance(handmade, list) else [handmade]
    if bad:
        raise FedL2PError(f"pipeline {name}: [personalize] methods lists '{bad[0]}'; hand-made methods are: "
                          f"{', '.join(methods.handmade())} (meta-net variants come from [[meta-train]])")
    last = None
    for pool in pools:
        cfg = _make(personalize.PersonalizeConfig, "personalize", pers | {"unseen": pool == "unseen", "methods": list(handmade)},
                    name)
        ids = [i for i in meta_ids if meta_train.method_of(p.store.load("meta-train", i, verify=False)).supports(pool)]
        last = step("personalize", pool, lambda f, cfg=cfg, ids=ids: personalize.run(cfg, p.store, pre.id, st.id, ids, f, progress(),
                                                                                      pfl_ids, runtime=base))
        if "analyze" in s and pool == s["analyze"].get("pool", pools[-1]):
            acfg = {k: v for k, v in s["analyze"].items() if k != "pool"}
            step("analyze", f"clusters ({pool})", lambda f, last=last, acfg=acfg: analyze.run(
                _make(analyze.ClustersConfig, "analyze", acfg, name), p.store, last.id, f))
    return p.results
