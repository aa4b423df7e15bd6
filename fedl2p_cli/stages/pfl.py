"""`fedl2p pfl-train`: the other personalised-FL systems, trained on a partition's seen clients. Each registered
system names its class (`System(trainer="package.module:Class")`, an `algorithms.systems.base.PFLSystem`), and its
rounds run here through the executor the Runtime chooses (this process, `--workers` processes, Flower):
pfedla / heurpfedla (Ma et al., CVPR 2022): the server's per-client models and hypernetworks -> server.safetensors.
cafeme (Vettoruzzo et al., SDM 2024): omega = {modulator, base model} -> omega.safetensors.
`fedl2p personalize --methods pfedla,heurpfedla,cafeme` evaluates them beside FT and FedL2P on the same clients.

A system registered with a bare module (`trainer="package.module"`: SETTINGS, train, load, accuracy functions; API
1's first protocol) still trains, in this process only; loading it notes once how to make it a class.
"""

from __future__ import annotations

from typing import Any

from .. import plugins
from ..algorithms.systems.base import PFLSystem, Trained
from ..algorithms.systems.options import as_record, parse
from ..artifacts import Artifact, Draft, Store
from ..catalog import SYSTEM, Catalog
from ..configs import PFLConfig
from ..core.config import validate
from ..engine.executors import open_pool
from ..engine.loop import Checkpoint
from ..engine.placement import OnDevice
from ..engine.rounds import run_rounds
from ..io.partition_h5 import Partition
from ..methods.registry import system_trainer as system  # the registered system's trainer, by its --algo
from ..models import registry
from ..runtime import Runtime
from .common import Progress, build_or_reuse, config_dict, watch, write_history
from .interface import Inputs, StageContext
from .rows import PARTITION


def check(cfg: PFLConfig, runtime: Runtime) -> None:
    """The config, and its `--algo` in the runtime's catalog."""
    check_planned(cfg, plugins.of(runtime))


def check_planned(cfg: PFLConfig, catalog: Catalog) -> None:
    """The config, and its `--algo` in `catalog` (a pipeline file's [[pfl]], when it compiles: the file's catalog;
    its system's own options included)."""
    validate(cfg)
    catalog.get(SYSTEM, cfg.algo)  # a registered system
    registry.spec(cfg.model, catalog)
    own_options(cfg, catalog)


def identity(cfg: PFLConfig, catalog: Catalog) -> dict:
    """Only the settings the chosen system reads are part of its artifact's id."""
    shared = ("algo", "model", "rounds", "fraction", "batch_size", "lr", "eval_every", "seed")
    d = config_dict(cfg)
    out = {k: d[k] for k in (*shared, *system(cfg.algo, catalog).SETTINGS[cfg.algo])}
    opts = own_options(cfg, catalog)
    return out if opts is None else out | {"options": as_record(opts)}  # a system without options: as before


def own_options(cfg: PFLConfig, catalog: Catalog) -> Any:
    """The system's own options (its `Options`), checked; None for a system that declares none."""
    sys_ = system(cfg.algo, catalog)
    if isinstance(sys_, PFLSystem):
        return sys_.options(cfg)
    return parse(None, cfg.options, cfg.algo)  # API 1's module protocol: no options of its own


def execute(cfg: PFLConfig, inputs: Inputs, ctx: StageContext) -> tuple[Artifact, bool]:
    """A personalised-FL system trained on the clients of `partition` among the inputs."""
    store, runtime, catalog = ctx.store, ctx.runtime, ctx.catalog
    check(cfg, runtime)
    got = inputs.get(PARTITION)
    part_art, part = got.artifact, got.value
    conf = identity(cfg, catalog) | {"in_channels": part.in_channels, "num_classes": part.num_classes}

    def build(draft: Draft) -> None:
        ckpt = Checkpoint(store.workdir("pfl", draft.id))
        if not ctx.resume:
            ckpt.clear()
        sys_ = system(cfg.algo, catalog)
        if isinstance(sys_, PFLSystem):
            history, draft.metrics = train(sys_, cfg, part, ckpt, watch(ctx.progress, draft), draft, runtime,
                                           (str(store.root), part_art.id))
        else:  # API 1's module protocol: its own rounds, in this process
            history, draft.metrics = sys_.train(cfg, part, ckpt, watch(ctx.progress, draft), draft, runtime)
        write_history(draft.path("history.csv"), history)
        draft.metrics |= {k: v for k, v in history[-1].items() if k in ("val_acc", "train_loss", "held_out_loss")}

    return build_or_reuse(store, "pfl", conf, {"partition": part_art.id}, build, ctx.force, runtime)


def train(sys_: PFLSystem, cfg: PFLConfig, part: Partition, ckpt: Checkpoint, progress: Progress, draft: Draft,
          runtime: Runtime, where: tuple[str, str]) -> tuple[list[dict], dict]:
    """A system's rounds through the Runtime's executor; `where` = (store root, partition id) lets a worker process
    or Flower ClientApp build its own context from the store."""
    local = OnDevice(sys_.context(cfg, part), runtime.torch_device)
    strategy = sys_.strategy(cfg, part, local)
    with open_pool(runtime, worker_context, (*where, cfg), type(sys_).client, local, len(part.pool(False)),
                   type(sys_).client_many) as pool:
        st = run_rounds(strategy, cfg.rounds, ckpt, progress, pool.map, runtime.policy())
    return st.history, sys_.save(strategy, st, draft)


def worker_context(root: str, partition_id: str, cfg: PFLConfig, runtime: Runtime) -> Any:
    """A worker's (or ClientApp's) own client context, built once from the store."""
    catalog = plugins.of(runtime)
    part = Inputs.given({"partition": partition_id}).bound(Store(root), catalog).get(PARTITION).value
    return system(cfg.algo, catalog).context(cfg, part)


def read(art: Artifact, catalog: Catalog) -> Trained:
    """The stage's reader (its row's `reader`): the trained system an artifact holds, its model and system looked up
    in `catalog` (the reading stage's)."""
    c = art.config
    cfg = PFLConfig(**{k: v for k, v in c.items() if k in PFLConfig.__dataclass_fields__})
    model = registry.stored(art, catalog)
    return Trained(cfg.algo, art.id, model, cfg, c["num_classes"], system(cfg.algo, catalog).load(art, cfg, model))


def load(store: Store, ref: str | None, catalog: Catalog) -> Trained:
    """A pfl artifact's trained system (its newest for None): for code outside the stages (tests, benches), which
    hand their own catalog."""
    return read(store.load("pfl", ref, catalog=catalog), catalog)


def label(cfg: PFLConfig) -> str:
    return cfg.algo

