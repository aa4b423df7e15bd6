"""`fedl2p pretrain`: FedAvg, FedBABU or Per-FedAvg (HF) on the seen clients -> global model artifact."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .. import plugins
from ..algorithms.local import LocalConfig
from ..artifacts import Artifact, Draft, Store, sha256_file
from ..catalog import PRETRAIN_ALGO, Catalog, PretrainAlgo
from ..configs import PretrainConfig
from ..core.aggregate import weighted_average
from ..core.client import Timer
from ..core.config import validate
from ..core.functional import get_state, global_accuracy, set_state
from ..engine.executors import open_pool
from ..engine.loop import Checkpoint, LoopState, generator, sample_clients, step_lr
from ..engine.placement import OnDevice
from ..engine.rounds import run_rounds
from ..errors import FedL2PError
from ..io import weights
from ..io.partition_h5 import Partition
from ..models import registry
from ..runtime import Runtime
from ..stage_table import stage
from .common import Progress, build_or_reuse, check_runtime, config_dict, watch, write_history
from .interface import Inputs, Planned, SectionFile, StageContext, runtime_keys
from .rows import PARTITION, Pretrained


def check(cfg: PretrainConfig, runtime: Runtime) -> None:
    validate(cfg)
    if cfg.init is None:
        plugins.of(runtime).get(PRETRAIN_ALGO, cfg.algo)  # UnknownName naming the choices
    registry.spec(cfg.model, plugins.of(runtime))
    check_runtime(runtime)


def pool_tensors(part: Partition, clients: list[int], split: str) -> tuple[torch.Tensor, torch.Tensor]:
    datas = [getattr(part.client(c), split) for c in clients]
    return torch.cat([d[0] for d in datas]), torch.cat([d[1] for d in datas])


def import_init(cfg: PretrainConfig, model: torch.nn.Module) -> dict:
    state = weights.import_state_dict(Path(cfg.init))  # type: ignore[arg-type]  # called only with --init
    own = get_state(model)
    head = registry.head_prefix(model)
    missing = [k for k in own if k not in state]
    if missing:
        raise FedL2PError(f"--init weights do not fit model '{cfg.model}' (missing '{missing[0]}')")
    for k, v in own.items():
        if state[k].shape != v.shape:
            if k.startswith(head) and cfg.reset_head:
                state[k] = v  # a fresh classifier for this partition's classes (as the paper does for ImageNet)
            elif k.startswith(head):
                raise FedL2PError(f"--init classifier '{k}' has shape {tuple(state[k].shape)} but the partition needs "
                                  f"{tuple(v.shape)}; pass --reset-head to start a new classifier")
            else:
                raise FedL2PError(f"--init tensor '{k}' has shape {tuple(state[k].shape)}, model '{cfg.model}' needs {tuple(v.shape)}")
    return {k: state[k].to(v.dtype) for k, v in own.items()}


@dataclass
class LocalTask:
    """What a sampled client receives in a pretraining round: the global state and the round's LR."""
    state: dict
    client: int
    lr: float
    round: int


@dataclass
class LocalResult:
    """A client's new local state, its sample count and mean training loss."""
    state: dict
    n: int
    loss: float


@dataclass
class PretrainContext:
    """What a client's local update reads, built once per process (the executor places it on its device)."""
    model: torch.nn.Module
    part: Partition
    algo: PretrainAlgo  # the catalog's entry, looked up once where the context is built
    local: LocalConfig
    seed: int


@dataclass
class Evaluation:
    """The global model's test data per pool (None: no unseen clients), evaluated on the runtime's device."""
    model: torch.nn.Module
    tests: dict


def pool_accuracies(ev: Evaluation, state: dict) -> dict:
    return {f"{pool}_acc": global_accuracy(ev.model, state, *data) for pool, data in ev.tests.items() if data is not None}


class PretrainStrategy:
    """FedAvg / FedBABU / Per-FedAvg (HF): sample, local updates, sample-weighted mean; evaluation on schedule (in
    this process, on `dev`)."""

    def __init__(self, cfg: PretrainConfig, part: Partition, model: torch.nn.Module, runtime: Runtime):
        self.cfg, self.part, self.model = cfg, part, model
        self.label = f"pretrain {cfg.algo}"
        self.seen, unseen = part.pool(False), part.pool(True)
        for c in self.seen:  # build every client's tensors once, before the rounds
            part.client(c)
        self.evaluate = OnDevice(Evaluation(model, {"seen": pool_tensors(part, self.seen, "test"),
                                                    "unseen": pool_tensors(part, unseen, "test") if unseen else None}),
                                 runtime.torch_device)
        self.client = client_of(cfg, part, model, runtime)

    def initial_state(self) -> LoopState:
        return LoopState(0, get_state(self.model))

    def stop(self, st: LoopState) -> bool:
        return False

    def configure(self, st: LoopState, rnd: int, attempt: int = 0) -> list[LocalTask]:
        lr = step_lr(self.cfg.lr, rnd, self.cfg.rounds)
        return [LocalTask(st.tensors, c, lr, rnd) for c in sample_clients(self.seen, self.cfg.fraction, self.cfg.seed, rnd, attempt)]

    def aggregate(self, st: LoopState, rnd: int, tasks: list[LocalTask], results: list[LocalResult], timer: Timer) -> dict:
        with timer.section("aggregate"):
            st.tensors = weighted_average([r.state for r in results], [r.n for r in results])
        rec = {"round": rnd + 1, "lr": tasks[0].lr, "train_loss": sum(r.loss for r in results) / len(results)}
        if (rnd + 1) % self.cfg.eval_every == 0 or rnd + 1 == self.cfg.rounds:
            with timer.section("eval"):
                rec |= self.evaluate(pool_accuracies, st.tensors)
        return rec | {f"{k}_s": v for k, v in timer.t.items()}

    def progress_info(self, rec: dict, st: LoopState) -> dict:
        return {"loss": rec["train_loss"], "acc": rec.get("seen_acc")}


def make_strategy(cfg: PretrainConfig, part: Partition, runtime: Runtime) -> PretrainStrategy:
    return PretrainStrategy(cfg, part, build_model(cfg, part, runtime), runtime)


def build_model(cfg: PretrainConfig, part: Partition, runtime: Runtime) -> torch.nn.Module:
    """The model for this partition (a model with its own BatchNorm layers checked on the partition's input shape)."""
    return registry.build(cfg.model, part.in_channels, part.num_classes, cfg.seed, tuple(part.images.shape[1:]),
                          catalog=plugins.of(runtime))


def client_of(cfg: PretrainConfig, part: Partition, model: torch.nn.Module, runtime: Runtime) -> PretrainContext:
    algo = plugins.of(runtime).get(PRETRAIN_ALGO, cfg.algo)
    return PretrainContext(model, part, algo, LocalConfig(epochs=cfg.local_epochs, batch_size=cfg.batch_size,
                                                            head=registry.head_prefix(model),
                                                            freeze_head=algo.freeze_head, pf_alpha=cfg.pf_alpha), cfg.seed)


def worker_client(root: str, partition_id: str, cfg: PretrainConfig, runtime: Runtime) -> PretrainContext:
    """A worker's own client context (model, client data), built once from the store in its initializer."""
    part = Inputs.given({"partition": partition_id}).bound(Store(root), plugins.of(runtime)).get(PARTITION).value
    return client_of(cfg, part, build_model(cfg, part, runtime), runtime)


def client_task(ctx: PretrainContext, task: LocalTask) -> LocalResult:
    """One client's local update, where the executor placed the context and the task."""
    x, y = ctx.part.client(task.client).train
    new, loss = ctx.algo.client(ctx.model, task.state, x, y, task.lr, ctx.local,
                                           generator(ctx.seed, task.round, task.client))
    return LocalResult(new, len(y), loss)


def client_tasks(ctx: PretrainContext, tasks: list[LocalTask]) -> list[LocalResult]:
    """Several clients' local updates as one computation (the batched executor; the algorithm's `client_many`)."""
    data = [ctx.part.client(t.client).train for t in tasks]
    many = ctx.algo.client_many  # the batched executor runs only algorithms that have one
    out = many(ctx.model, [t.state for t in tasks], [x for x, _ in data], [y for _, y in data],  # type: ignore[misc]
               [t.lr for t in tasks], ctx.local, [generator(ctx.seed, t.round, t.client) for t in tasks])
    return [LocalResult(new, len(y), loss) for (new, loss), (_, y) in zip(out, data)]


def train(cfg: PretrainConfig, part: Partition, ckpt: Checkpoint | None, progress: Progress,
          where: tuple[str, str] | None = None, *, runtime: Runtime) -> tuple[dict, list[dict]]:
    """`where` = (store root, partition id) lets --workers > 1 build each worker's copy from the store."""
    strategy = make_strategy(cfg, part, runtime)
    executor = runtime if where else runtime.replace(workers=1, engine="local")
    many = client_tasks if strategy.client.algo.client_many is not None else None
    with open_pool(executor, worker_client, (*(where or ("", "")), cfg), client_task, strategy.client,
                   len(strategy.seen), many) as pool:
        st = run_rounds(strategy, cfg.rounds, ckpt, progress, pool.map, runtime.policy())
    return st.tensors, st.history


def execute(cfg: PretrainConfig, inputs: Inputs, ctx: StageContext) -> tuple[Artifact, bool]:
    """The global model, trained federatedly on the clients of `partition` among the inputs (or imported: --init)."""
    store, runtime = ctx.store, ctx.runtime
    check(cfg, runtime)
    if cfg.init:
        cfg.init_sha256 = sha256_file(Path(cfg.init)) if Path(cfg.init).is_file() else None
    got = inputs.get(PARTITION)
    part_art, part = got.artifact, got.value
    parents = {"partition": part_art.id}
    conf = config_dict(cfg, exclude=("init",) if cfg.init else ())
    conf |= {"in_channels": part.in_channels, "num_classes": part.num_classes}

    def build(draft: Draft) -> None:
        if cfg.init:
            model = build_model(cfg, part, runtime)
            state, history = import_init(cfg, model), []  # type: ignore[var-annotated]  # the rounds' records (dicts)
        else:
            ckpt = Checkpoint(store.workdir("pretrain", draft.id))
            if not ctx.resume:
                ckpt.clear()
            state, history = train(cfg, part, ckpt, watch(ctx.progress, draft), (str(store.root), part_art.id),
                                   runtime=runtime)
        weights.save(draft.path("model.safetensors"), state, {"model": cfg.model})
        if history:
            write_history(draft.path("history.csv"), history)
            last = history[-1]
            draft.metrics = {k: last[k] for k in ("seen_acc", "unseen_acc", "train_loss") if k in last}
            if ctx.plot:
                from ..analysis.plots import pretrain_curves
                pretrain_curves(history, cfg.algo, draft.path("curves.png"))

    return build_or_reuse(store, "pretrain", conf, parents, build, ctx.force, runtime)


def read(art: Artifact, catalog: Catalog) -> Pretrained:
    """The stage's reader (its row's `reader`): a model built for the artifact (looked up in `catalog`, the reading
    stage's), holding its weights, and its state."""
    model = registry.stored(art, catalog)
    state = weights.load(art.file("model.safetensors"))
    set_state(model, state)
    return Pretrained(model, state)


def load(store: Store, ref: str | None, catalog: Catalog) -> tuple[Artifact, torch.nn.Module, dict]:
    """The pretrained artifact (its newest for None), its model and state: for code outside the stages (Flower, tests,
    benches), which hand their own catalog."""
    art = store.load("pretrain", ref, catalog=catalog)
    return (art, *read(art, catalog))


def plan(file: SectionFile) -> list[Planned]:
    """[pretrain]; its [pretrain.partition] (the partition stage's step) is the clients it pretrains on."""
    table = file.table("pretrain")
    own = table.pop("partition", None) is not None
    keys = runtime_keys(stage("pretrain"), None)
    values, rt = file.runtime(table, "pretrain", keys)
    cfg = file.config(PretrainConfig, "pretrain", values, also=(*keys, "partition"))
    return [Planned("pretrain", "pretrain", "pretrain", cfg,
                    {"partition": ("pretrain.partition",) if own else ("partition",)}, rt)]
