"""`fedl2p meta-train`: federated learning of lambda = {BNNet, LRNet, eta~} (Alg. 1), or L2P with --local."""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass

import numpy as np
import torch

from .. import plugins
from ..algorithms.fedl2p import ClientResult, Diverged, MetaConfig, client_update, client_update_many, hyper_fn
from ..algorithms.meta_grads import MetaGradient, with_lr_grad
from ..algorithms.meta_loop import (  # noqa: F401 (the loop's names, read here by tests and benches)
    MetaReply,
    MetaStrategy,
    MetaTask,
    guarded,
    initial_lambda,
    kept_lambda,
    kept_round,
    kept_round_text,
    round_record,
)
from ..algorithms.meta_signals import with_signal
from ..analysis import spread
from ..artifacts import Artifact, Draft, Store
from ..catalog import AGGREGATOR, LR_GRAD, META_GRAD, META_HEAD, META_INPUTS, META_SIGNAL, SERVER_STEP, Catalog
from ..configs import MetaTrainConfig, config_from_dict
from ..core.client import Timer
from ..core.config import validate
from ..core.metanets import Lambda
from ..core.settings import LEGACY_IFT, RoundPolicy
from ..engine.executors import open_pool
from ..engine.loop import Checkpoint, LoopState, generator, nest
from ..engine.placement import OnDevice
from ..engine.rounds import run_rounds
from ..errors import FedL2PError
from ..io import weights
from ..io.partition_h5 import Partition
from ..io.stats_h5 import StatsTable
from ..protocols import Aggregator, MetaHead, MetaInputs, ServerStep
from ..runtime import Runtime
from .common import NoProgress, Progress, build_or_reuse, check_runtime, config_dict, watch, write_history
from .interface import Inputs, StageContext
from .rows import PARTITION, PRETRAIN, STATS, MetaTrained, input_widths

NORM_PREFIX = "input_norm."
NEW_IFT_ONLY = ("eta_bound", "eta_grad")  # IFT-only options added after FOMAML+ artifacts existed: not in their ids


def check(cfg: MetaTrainConfig, runtime: Runtime) -> None:
    validate(cfg)  # types, ranges and choices (Literal fields)
    Entries.of(cfg, plugins.of(runtime))  # catalog entries: an unknown name stops here, naming the choices
    if cfg.local and runtime.engine not in ("local", "auto"):  # auto: --local runs no rounds, on any device
        raise FedL2PError(f"--engine {runtime.engine} runs federated rounds; --local (L2P) has none, use --engine local")
    check_runtime(runtime)


def meta_gradient_of(meta: MetaConfig, catalog: Catalog) -> MetaGradient:
    """The client update's meta-gradient: the --meta-grad entry with its LRs' path from the --lr-grad entry, sending
    the --meta-signal entry's gradient (`UnknownName` naming the choices for any)."""
    return with_signal(with_lr_grad(catalog.get(META_GRAD, meta.meta_grad), catalog.get(LR_GRAD, meta.lr_grad)),
                       catalog.get(META_SIGNAL, meta.meta_signal))


@dataclass(frozen=True)
class Entries:
    """A meta-train run's catalog entries, looked up once in the catalog handed over: the meta-gradient (with its
    LR path), the head, the server step, the inputs and the aggregator."""
    meta_gradient: MetaGradient
    head: MetaHead
    server_step: ServerStep
    inputs: MetaInputs
    aggregator: Aggregator

    @classmethod
    def of(cls, cfg: MetaTrainConfig, catalog: Catalog) -> Entries:
        return cls(meta_gradient_of(cfg.meta, catalog), catalog.get(META_HEAD, cfg.meta.head),
                   catalog.get(SERVER_STEP, cfg.meta_opt), catalog.get(META_INPUTS, cfg.input_norm),
                   catalog.get(AGGREGATOR, cfg.aggregator))


@dataclass
class Context:
    """What every client update needs, built once per run (on the CPU; an executor places it on its device)."""

    model: torch.nn.Module
    theta_g: dict
    part: Partition
    stats: StatsTable
    cfg: MetaTrainConfig
    entries: Entries  # the run's catalog entries
    norm: dict | None = None  # the --input-norm entry's state, fitted on the seen clients (None: it keeps none)

    def inputs(self, c: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Client c's meta-net inputs: its statistics through the --input-norm entry."""
        return self.entries.inputs.apply(self.norm or {}, *self.stats.inputs(c))

    def update(self, c: int, lam: Lambda, gen: torch.Generator, timer: Timer) -> ClientResult:
        """One client's update, where the context and `lam` are (the executor put them there)."""
        xi, x = self.inputs(c)
        return client_update(self.model, self.theta_g, lam, xi, x, self.stats.client_bn(c), self.part.client(c),
                             self.cfg.meta, gen, timer, self.entries.meta_gradient, self.entries.head)

    def update_many(self, cs: list[int], lams: list[Lambda], gens: list[torch.Generator], timer: Timer
                    ) -> list[ClientResult | Diverged]:
        """Several clients' updates as one batched computation (`client_update_many`): per client as `update`."""
        return client_update_many(self.model, self.theta_g, lams, [self.inputs(c) for c in cs],
                                  [self.stats.client_bn(c) for c in cs], [self.part.client(c) for c in cs],
                                  self.cfg.meta, gens, timer, self.entries.meta_gradient, self.entries.head)

    # what the federated loop reads of the run (algorithms/meta_loop.py's Federation)
    @property
    def server_step(self) -> ServerStep:
        return self.entries.server_step

    @property
    def aggregator(self) -> Aggregator:
        return self.entries.aggregator

    def seen(self) -> list[int]:
        return self.part.pool(False)

    def train_size(self, c: int) -> int | None:
        return int(self.part.offsets[c][1] - self.part.offsets[c][0])

    def snapshot(self, lam: Lambda) -> dict:
        """What lambda currently hands every seen client: mean beta per domain and BN layer, mean eta per layer
        group (top-level module). Cheap (meta-net forwards only); makes the learning visible."""
        seen = self.part.pool(False)
        n_p = len(self.theta_g)
        with torch.no_grad():
            head = self.entries.head
            outs = [hyper_fn(*self.inputs(c), n_p, self.cfg.meta, head)(lam) for c in seen]
        beta = torch.stack([o[0] for o in outs])
        etas = torch.stack([o[1] for o in outs])
        eta = etas.mean(0)
        rec: dict[str, float] = spread.by_kind(beta.numpy(), etas.numpy(), np.asarray(self.part.domain[seen]),
                                              list(self.part.domain_names), self.cfg.meta.base_lr)
        groups: dict[str, list[float]] = {}
        kinds = {n: m.__class__.__name__ for n, m in self.model.named_children()}
        for name, e in zip(self.theta_g, eta):
            top = name.split(".")[0]
            groups.setdefault(f"{top}-{kinds.get(top, '')}".rstrip("-"), []).append(float(e))
        rec |= {f"etagroup_{g}": float(np.mean(v)) for g, v in groups.items()}
        base = self.cfg.meta.base_lr  # eta~ and eta start at the base LR: these read as growth factors
        rec["eta_x"] = float(eta.mean()) / base
        if "eta" in lam:
            rec["etatilde_x"] = float(lam["eta"].mean()) / base
        elif "logeta" in lam:
            rec["etatilde_x"] = float(lam["logeta"].exp().mean()) / base
        return rec


def make_context(root: str, pretrain_id: str, partition_id: str, stats_id: str, cfg: MetaTrainConfig,
                 runtime: Runtime, table: StatsTable | None = None) -> Context:
    """Everything a client update reads, from the store (also each worker's initializer; `table`: the statistics the
    caller already loaded). `runtime` is the builder's signature the executors call; the executor places it."""
    catalog = plugins.of(runtime)
    inputs = Inputs.given({"partition": partition_id, "pretrain": pretrain_id, "stats": stats_id}).bound(Store(root), catalog)
    part = inputs.get(PARTITION).value
    model, state = inputs.get(PRETRAIN).value
    if table is None:
        table = inputs.get(STATS).value
    theta_g = {n: state[n] for n, _ in model.named_parameters()}
    rows = [table.row(c) for c in part.pool(False)]
    entries = Entries.of(cfg, catalog)
    norm = fit_inputs(entries.inputs, table.xi[rows], table.x[rows])
    return Context(model, theta_g, part, table, cfg, entries, norm or None)


def fit_inputs(entry: MetaInputs, xi: torch.Tensor, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The --input-norm entry fitted on the seen clients' statistics, its state checked where it enters: tensors by
    name (stored with lambda), and BNNet's input still one value per BN layer."""
    state = entry.fit(xi, x)
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise FedL2PError(f"--input-norm {entry.name}: fit must return a dict of tensors by name")
    zi, zx = entry.apply(state, xi[0], x[0])
    if tuple(zi.shape) != (xi.shape[1],) or zx.dim() != 1:
        raise FedL2PError(f"--input-norm {entry.name}: apply must give BNNet one input per BN layer ([{xi.shape[1]}], got "
                          f"{list(zi.shape)}) and LRNet a vector (got {list(zx.shape)})")
    return state


def client_task(ctx: Context, task: MetaTask) -> MetaReply:
    """One client's update in its round, with its own generator (seed, round, client): the same wherever it runs."""
    c = task.client
    return guarded(c, lambda timer: ctx.update(c, task.lam, generator(ctx.cfg.seed, task.round, c), timer))


def client_tasks(ctx: Context, tasks: list[MetaTask]) -> list[MetaReply]:
    """`client_task` for a group of clients at once (the batched executor): each with its own generator, each reply
    with an equal share of the group's time."""
    timer = Timer()
    gens = [generator(ctx.cfg.seed, t.round, t.client) for t in tasks]
    outs = ctx.update_many([t.client for t in tasks], [t.lam for t in tasks], gens, timer)
    share = {k: v / len(tasks) for k, v in timer.t.items()}
    return [MetaReply(None, share, f"client {t.client}: {o}") if isinstance(o, Diverged) else MetaReply(o, share)
            for t, o in zip(tasks, outs)]


def federated(ctx: Context, lam0: Lambda, ckpt: Checkpoint, progress: Progress, pool, policy: RoundPolicy
              ) -> tuple[Lambda, list[dict], dict]:
    st = run_rounds(MetaStrategy(ctx, lam0), ctx.cfg.rounds, ckpt, progress, pool.map, policy)
    return kept_lambda(ctx.cfg, st), st.history, st.extra


def local(ctx: Context, lam0: Lambda, ckpt: Checkpoint, progress: Progress, dev: torch.device
          ) -> tuple[Lambda, list[dict], dict]:
    """L2P: each seen client runs the same number of meta-iterations it would get in expectation, alone, in this
    process on `dev`. Checkpointed after every client (`next_round` counts finished clients)."""
    cfg, on = ctx.cfg, OnDevice(ctx, dev)
    seen = ctx.part.pool(False)
    steps = max(1, round(cfg.rounds * cfg.fraction))
    st = ckpt.load() or LoopState(0, {}, extra={"diverged": []})
    out, history, diverged = st.tensors, st.history, st.extra["diverged"]
    progress.start("L2P (per-client meta-learning)", len(seen))
    progress.advance(st.next_round)
    for i, c in enumerate(seen[st.next_round:], start=st.next_round):
        lam, best, best_val = dict(lam0), dict(lam0), math.inf
        for s in range(steps):
            timer, t0 = Timer(), time.perf_counter()
            try:
                r = on(lambda cx, lm: cx.update(c, lm, generator(cfg.seed, s, c), timer), lam)  # noqa: B023 -- called at once, in this step
            except Diverged as e:
                diverged.append(f"client {c} step {s + 1}: {e}")
                break
            if r.val_loss < best_val:
                best, best_val = lam, r.val_loss
            lam = r.lam
            history.append({"client": c, **round_record(s, [r], timer, t0)})
        out |= nest(f"client{c}", best)
        ckpt.save(LoopState(i + 1, out, history, {"diverged": diverged}))
        progress.advance(1)
    progress.stop()
    return out, history, {"diverged": "; ".join(diverged) or None, "steps_per_client": steps}


def summarize_rounds(history: list[dict], local_mode: bool) -> list[dict]:
    """Per-step mean over clients for L2P, so both modes plot the same way."""
    if not local_mode:
        return history
    by: dict[int, list[dict]] = {}
    for h in history:
        by.setdefault(h["round"], []).append(h)
    return [{"round": r, "val_loss": float(np.mean([h["val_loss"] for h in hs])),
             "train_loss": float(np.mean([h["train_loss"] for h in hs]))} for r, hs in sorted(by.items())]


def identity(cfg: MetaTrainConfig) -> dict:
    """The settings an artifact's id hashes (where it runs left out). FOMAML+ has no Neumann series: its id records
    the IFT-only series options at the values every id held before their defaults changed, so FOMAML+ ids stay."""
    config = config_dict(cfg)
    if cfg.meta.meta_grad != "ift":
        config["meta"] = {k: v for k, v in (config["meta"] | LEGACY_IFT).items() if k not in NEW_IFT_ONLY}
    return config | {"variant": cfg.spelled()}


def execute(cfg: MetaTrainConfig, inputs: Inputs, ctx: StageContext) -> tuple[Artifact, bool]:
    """The meta-nets learned federatedly (or per client: L2P) from the `pretrain`ed model and its `stats` among the
    inputs (default: the newest model, and its newest statistics)."""
    store, runtime, progress, resume, catalog = ctx.store, ctx.runtime, ctx.progress, ctx.resume, ctx.catalog
    check(cfg, runtime)
    pre_art = inputs.get(PRETRAIN).artifact
    stats_in = inputs.made_from(STATS, PRETRAIN, pre_art.id, "pretrained model")
    stats_art, table = stats_in.artifact, stats_in.value
    parents = {"partition": stats_art.parents["partition"], "pretrain": pre_art.id, "stats": stats_art.id}
    config = identity(cfg)

    def build(draft: Draft) -> None:
        ids = (str(store.root), pre_art.id, parents["partition"], stats_art.id)
        ctx = make_context(*ids, cfg, runtime, table)
        part, norm = ctx.part, ctx.norm
        if any(part.offsets[c][2] - part.offsets[c][1] < 1 for c in part.pool(False)):
            raise FedL2PError("meta-training needs validation data on every seen client; partition with --val-fraction > 0")
        lam0 = initial_lambda(cfg, ctx.entries.head, *input_widths(ctx.entries.inputs, norm, table), len(ctx.theta_g))
        ckpt = Checkpoint(store.workdir("meta-train", draft.id))
        if not resume:
            ckpt.clear()
        source = None if cfg.local else extend(store, ckpt, config, parents, cfg.rounds, catalog)
        if cfg.local:
            lam, history, extra = local(ctx, lam0, ckpt, progress or NoProgress(), runtime.torch_device)
        else:
            with open_pool(runtime, make_context, (*ids, cfg), client_task, ctx, len(part.pool(False)),
                           client_tasks) as pool:
                lam, history, extra = federated(ctx, lam0, ckpt, watch(progress, draft), pool, runtime.policy())
            # the loop's last state, so that a run with more rounds continues from here (`extend`)
            shutil.copyfile(ckpt.folder / Checkpoint.NAME, draft.path(STATE))
        stored = lam | {f"{NORM_PREFIX}{k}": v for k, v in (norm or {}).items()}
        weights.save(draft.path("lambda.safetensors"), stored, {"variant": cfg.variant()})
        write_history(draft.path("history.csv"), history)
        curve = summarize_rounds([h for h in history if not h.get("diverged")], cfg.local)
        draft.metrics = {"variant": cfg.variant(), "rounds_run": len(curve),
                         "first_val_loss": curve[0]["val_loss"] if curve else None,
                         "last_val_loss": curve[-1]["val_loss"] if curve else None,
                         "best_val_loss": min(h["val_loss"] for h in curve) if curve else None,
                         "best_round": extra.get("best_round"), "diverged": extra.get("diverged")}
        if source is not None:
            draft.metrics["extended_from"] = source
        if not cfg.local:
            draft.metrics["kept_round"] = kept_round(cfg, extra, len(curve))
            draft.metrics["kept"] = kept_round_text(cfg, extra, len(curve))
            # the split between kinds of client that training made, beside the one the initial lambda already had
            draft.metrics["split"] = {"round 0": by_kind_summary(ctx.snapshot(lam0)),
                                      "kept": by_kind_summary(ctx.snapshot(lam))}
        if not curve:
            return
        from ..analysis.plots import learning_curves, meta_curves
        meta_curves(curve, draft.path("val_loss.png"))
        if not cfg.local:
            learning_curves(curve, part.domain_names, draft.path("learning.png"))

    return build_or_reuse(store, "meta-train", config, parents, build, ctx.force, runtime)


def by_kind_summary(snap: dict) -> dict:
    """A snapshot's per-kind strategy and split (`spread.by_kind`'s keys), rounded for the manifest."""
    keep = ("beta_", "lrx_", "split_", "frozen")
    return {k: round(float(v), 4) for k, v in snap.items() if k.startswith(keep)}


STATE = "state.safetensors"  # a federated meta-train artifact's last loop state (lambda, best, history, counters)


# settings the federated loop never reads: runs that differ only in these share every round (`extend`)
LOOP_FREE = ("rounds", "keep", "variant")


def extend(store: Store, ckpt: Checkpoint, config: dict, parents: dict, rounds: int, catalog: Catalog) -> str | None:
    """Start a run of `rounds` rounds from the longest run of at most as many rounds whose loop is this run's (the same
    settings, parents and data; `--keep` may differ, since it only picks which lambda is stored at the end), if the
    store holds one (and this run has no checkpoint of its own): its last state becomes this run's checkpoint. Every
    draw of round t is seeded by (seed, t, client) and no round depends on the total, so the result is the one a run
    from the start gives, and the id stays the hash of the settings (`rounds` included). A `--keep last` run of as
    many rounds as a `--keep best` one runs no round. Returns the source's id."""
    if (ckpt.folder / Checkpoint.NAME).is_file():
        return None
    loop = {k: v for k, v in config.items() if k not in LOOP_FREE}
    best: tuple[int, str] | None = None
    for art in store.iter("meta-train"):
        r = art.config.get("rounds")
        if (art.parents == parents and isinstance(r, int) and r <= rounds and (best is None or r > best[0])
                and art.config != config  # itself (a --force rebuild) is never its own source
                and {k: v for k, v in art.config.items() if k not in LOOP_FREE} == loop
                and STATE in art.manifest["files"]):
            best = (r, art.id)
    if best is None:
        return None
    art = store.load("meta-train", best[1], catalog=catalog)  # its hashes verified before its state is used
    ckpt.folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(art.file(STATE), ckpt.folder / Checkpoint.NAME)
    return art.id


def read(art: Artifact, catalog: Catalog) -> MetaTrained:
    """The stage's reader (its row's `reader`): lambda, its inputs' state, settings, and its head and inputs entries
    in `catalog` (the reading stage's)."""
    stored_ = weights.load(art.file("lambda.safetensors"))
    norm = {k[len(NORM_PREFIX):]: v for k, v in stored_.items() if k.startswith(NORM_PREFIX)}
    cfg = config_from_dict(art.config)
    return MetaTrained({k: v for k, v in stored_.items() if not k.startswith(NORM_PREFIX)}, norm or None, cfg,
                       catalog.get(META_HEAD, cfg.meta.head), catalog.get(META_INPUTS, cfg.input_norm))


def load_lambda(store: Store, ref: str | None, catalog: Catalog) -> tuple[Artifact, Lambda, dict | None]:
    """lambda and its input standardisation (None: raw inputs): for code outside the stages (tests, benches), which
    hand their own catalog."""
    art = store.load("meta-train", ref, catalog=catalog)
    got = read(art, catalog)
    return art, got.lam, got.norm


def label(cfg: MetaTrainConfig) -> str:
    """A pipeline step's short name: the variant."""
    return cfg.variant()
