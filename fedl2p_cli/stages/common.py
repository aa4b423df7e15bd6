"""What every stage shares: config hashing, reuse of an existing artifact, progress reporting."""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import plugins, tracking
from ..artifacts import Artifact, Draft, Store, artifact_id
from ..catalog import (
    AGGREGATOR,
    DATASET,
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
    Kind,
)
from ..core.config import reference_of, validate
from ..engine import executors
from ..engine.progress import NoProgress, Progress  # noqa: F401 (re-exported: the stages' import)
from ..engine.rounds import Watch
from ..errors import ArtifactError
from ..runtime import Runtime


class Missing(ArtifactError):
    """An artifact asked for with `Runtime.reuse_only` does not exist (its stage and id name it)."""

    def __init__(self, stage: str, aid: str):
        super().__init__(f"no {stage} artifact {aid} yet")
        self.stage, self.id = stage, aid


def config_dict(cfg: Any, exclude: tuple[str, ...] = ()) -> dict:
    """The identity-relevant part of a config dataclass (locations and cosmetics excluded; where the work runs is
    never in a config: it is the Runtime, fedl2p_cli/runtime.py). A field marked
    `identity_default` (an option added after artifacts existed) is left out while it holds its reference value (its
    default, unless the default moved: `core.config.reference_of`), so artifacts built before the option existed keep
    their ids."""
    d = _identity(cfg)
    for k in exclude:
        d.pop(k, None)
    return d


def _identity(cfg: Any) -> dict:
    out = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if f.metadata.get("identity_default") and v == reference_of(f):
            continue
        out[f.name] = _identity(v) if dataclasses.is_dataclass(v) else copy.deepcopy(v)
    return out


# config keys that name registered pieces, and the kinds of piece they name
PIECES: dict[str, tuple[Kind[object], ...]] = {
    "dataset": (DATASET,), "model": (MODEL,), "algo": (PRETRAIN_ALGO, SYSTEM), "methods": (METHOD,),
    "meta.meta_grad": (META_GRAD,), "meta.head": (META_HEAD,), "meta.lr_grad": (LR_GRAD,),
    "meta_opt": (SERVER_STEP,), "input_norm": (META_INPUTS,),
    "meta.meta_signal": (META_SIGNAL,), "aggregator": (AGGREGATOR,)}  # dotted: a nested field


def plugin_records(store: Store, config: dict, parents: dict[str, str], runtime: Runtime) -> list[dict]:
    """The plugins an artifact is made with: those owning a piece its config names (in the runtime's catalog), and
    its parents'."""
    names: dict[Kind[object], list[str]] = {}
    for key, kinds in PIECES.items():
        values: Any = config
        for part in key.split("."):
            values = values.get(part) if isinstance(values, dict) else None
        for kind in kinds:
            names.setdefault(kind, []).extend(v for v in (values if isinstance(values, list) else [values]) if isinstance(v, str))
    out = {r["module"]: r for r in plugins.used(names, plugins.of(runtime))}
    for key, aid in parents.items():
        path = store.root / key.split(":")[0] / aid / "manifest.json"
        if path.is_file():
            out |= {r["module"]: r for r in json.loads(path.read_text()).get("plugins", [])}
    return list(out.values())


def watch(progress: Progress | None, draft: Draft) -> Watch:
    """What a build's rounds report to: the stage's progress bar and the observers the build opened (--track)."""
    return Watch(progress or NoProgress(), draft.observers)


def build_or_reuse(store: Store, stage: str, config: dict, parents: dict[str, str],
                   build: Callable[[Draft], None], force: bool, runtime: Runtime) -> tuple[Artifact, bool]:
    """Return the artifact for these inputs, building it (atomically) only if it does not exist. `runtime`: where it
    is built, which its manifest records (never its id), how long it waits for another builder, what it logs to, and
    whether it may build at all (`reuse_only`)."""
    aid = artifact_id(stage, config, parents)
    catalog = plugins.of(runtime)  # a reused artifact's plugins: loaded in the run's catalog
    if store.exists(stage, aid) and not (force and not runtime.reuse_only):
        return store.load(stage, aid, catalog=catalog), True
    if runtime.reuse_only:
        raise Missing(stage, aid)
    with store.building(stage, aid, runtime.lock_timeout):
        if store.exists(stage, aid) and not force:  # another process published it while we waited for its lock
            return store.load(stage, aid, catalog=catalog), True
        draft = store.draft(stage, config, parents)
        draft.plugins = plugin_records(store, config, parents, runtime)
        draft.computed_on = runtime.describe()
        try:
            t0 = time.perf_counter()
            with tracking.tracked(stage, draft, runtime):  # --track: the rounds and metrics to TensorBoard / MLflow
                build(draft)
            draft.build_s = time.perf_counter() - t0
            return draft.publish(), False
        except BaseException:
            draft.discard()
            raise


def check_runtime(runtime: Runtime) -> None:
    """The runtime options of a stage with rounds, valid and consistent: --gpus-per-client goes with --engine flower
    on a GPU, and a GPU run on Flower needs it (Ray hides the GPUs from a ClientApp that was given none)."""
    validate(runtime)
    # --engine names a registered executor, which checks the options it reads
    executors.get(runtime.executor, plugins.of(runtime)).check(runtime)


def write_history(path: Path, history: list[dict]) -> None:
    """A stage's per-round records as CSV (the rounds' keys, in order of first appearance)."""
    keys = list(dict.fromkeys(k for r in history for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(history)
