"""FedL2P's federated loop (Alg. 1) as a round strategy: sample clients, broadcast lambda, aggregate their updates
(robustly, with the --server-step entry), keep the best lambda. The meta-train stage runs it over a partition's seen
clients, Flower's ServerApp over a deployment's sites: each hands it a `Federation`, what the loop reads of the run."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from ..core.aggregate import reject_reason, update_norms
from ..core.client import Timer
from ..engine.loop import LoopState, group_of, nest, sample_clients
from ..errors import FedL2PError
from .fedl2p import ClientResult, Diverged

if TYPE_CHECKING:
    from ..configs import MetaTrainConfig
    from ..core.metanets import Lambda
    from ..protocols import Aggregator, MetaHead, ServerStep


class Federation(Protocol):
    """What the loop reads of the run it serves: its settings, its --meta-opt and --aggregate entries, the clients it samples from,
    a client's training-set size (None: unknown, a site's own) and what lambda hands the clients now (a snapshot for
    the history; {} where no statistics are at hand)."""

    @property
    def cfg(self) -> MetaTrainConfig: ...

    @property
    def server_step(self) -> ServerStep: ...

    @property
    def aggregator(self) -> Aggregator: ...

    def seen(self) -> list[int]: ...

    def train_size(self, c: int) -> int | None: ...

    def snapshot(self, lam: Lambda) -> dict: ...


def initial_lambda(cfg: MetaTrainConfig, head: MetaHead, n_bn: int, n_x: int, n_params: int) -> Lambda:
    """lambda at round 0, drawn by the --head entry from the run's seed."""
    return head.init(n_bn, n_x, n_params, cfg.meta, cfg.nets, cfg.seed)


@dataclass
class MetaTask:
    """What a sampled client receives in a meta-train round: the broadcast lambda."""
    client: int
    lam: Lambda
    round: int


@dataclass
class MetaReply:
    """A client's answer: its update, or why it diverged instead, and its time split (seconds per section)."""
    result: ClientResult | None
    times: dict
    diverged: str | None = None


def guarded(c: int, update: Callable[[Timer], ClientResult]) -> MetaReply:
    """Run update(timer); a divergence comes back as its message in place of the result (the engine never sees a
    client's exception), with the client's time split either way."""
    timer = Timer()
    try:
        return MetaReply(update(timer), timer.t)
    except Diverged as e:
        return MetaReply(None, timer.t, f"client {c}: {e}")


def round_record(rnd: int, results: list[ClientResult], timer: Timer, t0: float | None = None) -> dict:
    """A round's history record from its clients' results (sample-weighted means, the time split)."""
    w = np.array([r.n for r in results], dtype=float)
    rec = {"round": rnd + 1, "clients": len(results),
           "val_loss": float(np.average([r.val_loss for r in results], weights=w)),
           "train_loss": float(np.average([r.train_loss for r in results], weights=w))}
    beta = torch.stack([r.beta for r in results]).mean(0)
    eta = torch.stack([r.eta for r in results]).mean(0)
    rec |= {f"beta_{i}": float(b) for i, b in enumerate(beta)}
    rec |= {f"eta_{i}": float(e) for i, e in enumerate(eta)}
    rec |= {k: float(np.mean([r.report[k] for r in results])) for k in results[0].report}
    rec |= {f"{k}_s": v for k, v in timer.t.items()}
    return rec | ({"round_s": time.perf_counter() - t0} if t0 is not None else {})


class MetaStrategy:
    """FedL2P meta-training (Alg. 1): broadcast lambda, K meta-iterations per sampled client, sample-weighted mean
    (or FedAdam); the lambda the clients received is kept when their mean validation loss is the best so far."""

    def __init__(self, ctx: Federation, lam0: Lambda):
        self.ctx, self.lam0, self.cfg = ctx, lam0, ctx.cfg
        self.label = f"meta-train ({self.cfg.variant()})"
        self.seen = ctx.seen()
        self.names: dict[int, str] = {}  # a deployment's site names by client id (logs and history name sites so)

    def name(self, c: int) -> str:
        return self.names.get(c, f"client {c}")

    def initial_state(self) -> LoopState:
        lam0 = self.lam0
        return LoopState(0, nest("lam", lam0) | nest("best", lam0),
                         extra={"best_val": math.inf, "best_round": 0, "stale": 0, "diverged": None})

    def stop(self, st: LoopState) -> bool:
        return bool(st.extra["diverged"] or (self.cfg.patience and st.extra["stale"] >= self.cfg.patience))

    def configure(self, st: LoopState, rnd: int, attempt: int = 0) -> list[MetaTask]:
        lam = group_of(st.tensors, "lam")
        return [MetaTask(c, lam, rnd) for c in sample_clients(self.seen, self.cfg.fraction, self.cfg.seed, rnd, attempt)]

    def accepted(self, lam: Lambda, tasks: list[MetaTask], results: list[ClientResult]) -> tuple[list[ClientResult], list[str]]:
        """The replies that may be aggregated, and why each other one was dropped (never aggregated, always logged)."""
        keep, dropped = [], []
        for c, r in zip((t.client for t in tasks), results):
            why = reject_reason(lam, r.lam, r.n, self.train_size(c)) if isinstance(r, ClientResult) else "not a client result"
            (dropped.append(f"{self.name(c)}: {why}") if why else keep.append((c, r)))
        if self.cfg.norm_bound and len(keep) > 1:
            norms = update_norms(lam, [r.lam for _, r in keep])
            bound = self.cfg.norm_bound * float(np.median(norms))
            dropped += [f"{self.name(c)}: update norm {m:.3g} > {bound:.3g} (--norm-bound x median)"
                        for (c, _), m in zip(keep, norms) if m > bound]
            keep = [cr for cr, m in zip(keep, norms) if m <= bound]
        return [r for _, r in keep], dropped

    def train_size(self, c: int) -> int | None:
        return self.ctx.train_size(c)

    def aggregate(self, st: LoopState, rnd: int, tasks: list[MetaTask], done: list, timer: Timer) -> dict | None:
        done = [d if isinstance(d, MetaReply) else MetaReply(None, {}) for d in done]  # a site may send anything
        bad = [d.diverged for d in done if d.diverged]
        if bad:  # the round is recorded (marked in history.csv's `diverged` column); lambda stays what it was
            st.extra["diverged"] = f"round {rnd + 1}: {bad[0]}"
            return {"round": rnd + 1, "clients": len(done), "sampled": " ".join(str(t.client) for t in tasks),
                    "diverged": "; ".join(bad)}
        for d in done:  # the clients' own time split, wherever they ran
            for k, v in d.times.items():
                timer.add(k, float(v))
        lam, sampled = tasks[0].lam, [t.client for t in tasks]
        results, dropped = self.accepted(lam, tasks, [d.result for d in done])
        if not results:
            raise FedL2PError(f"meta-train round {rnd + 1}: every reply was dropped ({'; '.join(dropped)})")
        rec = round_record(rnd, results, timer) | {"sampled": " ".join(self.names.get(c, str(c)) for c in sampled)} | self.ctx.snapshot(lam)
        if dropped:
            rec["dropped"] = "; ".join(dropped)
        if rec["val_loss"] < st.extra["best_val"]:  # lambda_t (the one the clients received) scored best
            st.extra |= {"best_val": rec["val_loss"], "best_round": rnd + 1, "stale": 0}
            st.tensors |= nest("best", lam)
        else:
            st.extra["stale"] += 1
        with timer.section("aggregate"):
            weights = [1.0 if self.cfg.client_weights == "equal" else float(r.n) for r in results]
            new = self.ctx.aggregator.combine(lam, [r.lam for r in results], weights)
            new, state = self.ctx.server_step.step(lam, new, group_of(st.tensors, "opt"), rnd + 1, self.cfg.server_lr)
            if state:  # a step with moments (fedadam): checkpointed with the loop
                st.tensors |= nest("opt", state)
        st.tensors |= nest("lam", new)
        return rec | {"aggregate_s": timer.t["aggregate"]}

    def progress_info(self, rec: dict, st: LoopState) -> dict:
        if rec.get("diverged"):
            return {"diverged in round": rec["round"], "kept": kept_round_text(self.cfg, st.extra, rec["round"] - 1)}
        return {"val": rec["val_loss"], "best": st.extra["best_val"]}


def kept_lambda(cfg: MetaTrainConfig, st: LoopState) -> Lambda:
    """The lambda the artifact keeps (--keep). Diverged in round 1: the best so far is the initial one (kept, with the
    warning in the metrics)."""
    return group_of(st.tensors, "lam" if cfg.keep == "last" and not st.extra["diverged"] else "best")


def kept_round(cfg: MetaTrainConfig, extra: dict, rounds_run: int) -> int:
    """The round whose lambda the artifact keeps: --keep last (no divergence) keeps the aggregate after the last
    round run; otherwise the lambda broadcast in `best_round` (0: the initial lambda)."""
    return rounds_run if cfg.keep == "last" and not extra.get("diverged") else int(extra.get("best_round") or 0)


def kept_round_text(cfg: MetaTrainConfig, extra: dict, rounds_run: int) -> str:
    r = kept_round(cfg, extra, rounds_run)
    if cfg.keep == "last" and not extra.get("diverged"):
        return f"round {r}'s aggregate (--keep last)"
    return "the initial lambda" if r == 0 else f"the lambda broadcast in round {r} (lowest validation loss)"
