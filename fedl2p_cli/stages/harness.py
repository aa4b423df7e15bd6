"""The personalisation harness: what `personalize`, `analyze beta-grid`, `analyze decompose` and the bench scripts
share when they fine-tune clients of a pretrained model. The executor's placement (`Harness.on`) puts the model, its
parameters, the clients and their statistics on the runtime's device once, and each strategy there as it is
fine-tuned (`place`); every fine-tuning of client c with seed s draws its
batches from one named stream (`batches(seed, c)`), so every method, strategy and analysis of a client and seed sees
the same batches and their accuracies are paired."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import Tensor

from ..core.batched import finetune_many, scores_many
from ..core.client import ClientData
from ..core.finetune import ClientBN, FinetuneResult, Strategy, finetune, per_sample, personalized_accuracy, personalized_sums
from ..core.functional import evaluate, evaluate_sums, global_accuracy, global_correct
from ..engine.loop import batch_stream as batches
from ..engine.placement import OnDevice
from ..io.partition_h5 import Partition
from ..io.stats_h5 import StatsTable


@dataclass
class Client:
    """One client on the harness's device: its data and its stored BN statistics (where fine-tuning starts)."""
    id: int
    data: ClientData
    bn0: ClientBN


@dataclass
class Trial:
    """One fine-tuning of a client under a strategy with a seed; its accuracies are computed when asked."""
    harness: Harness
    client: Client
    strategy: Strategy
    ft: FinetuneResult
    scores: dict = field(default_factory=dict)
    key: tuple | None = None  # (client, seed, strategy_key): where `prefetch` left its scores

    def evaluate(self, split: str, stats: str = "running") -> tuple[float, float]:
        """(loss, accuracy) on the client's `split` (val, test) under `stats` (core.finetune.inference_policy);
        computed once per split and statistics, or read with its group's (`Harness.prefetch`)."""
        if (split, stats) not in self.scores:
            h = self.harness
            got = h.scored.get((self.key, split, stats)) if self.key is not None else None
            if got is None:
                x, y = getattr(self.client.data, split)
                got = personalized_accuracy(h.model, self.ft.params, x, y, self.strategy, self.ft.bn, h.batch_size, stats)
            self.scores[split, stats] = got
        return self.scores[split, stats]


def _unplaced(obj: Any) -> Any:
    raise RuntimeError("a Harness computes where an executor placed it: build it with Harness.on(device, ...)")


@dataclass
class Harness:
    """A pretrained model (eval mode) with its parameters `theta`, the clients (`part`) and their statistics
    (`table`), and the fine-tuning budget every strategy shares; built by `on`, on a device."""
    model: torch.nn.Module
    state: dict
    part: Partition
    table: StatsTable
    epochs: int
    batch_size: int
    client_bn: str = "precise"
    theta: dict = field(init=False)
    place: Callable[[Any], Any] = field(default=_unplaced, init=False, repr=False)  # a call's own inputs -> the device
    ready: dict = field(default_factory=dict, init=False, repr=False)  # fine-tunings computed ahead (`prefetch`)
    scored: dict = field(default_factory=dict, init=False, repr=False)  # their scores, read in one go (`prefetch`)
    plain: dict = field(default_factory=dict, init=False, repr=False)  # (client, split) -> unadapted (loss, accuracy)

    def __post_init__(self) -> None:
        self.model.eval()
        self.theta = {n: self.state[n] for n, _ in self.model.named_parameters()}

    @classmethod
    def on(cls, dev: torch.device, *args: Any, **kw: Any) -> Harness:
        """The harness the executor's placement puts on `dev` (engine/placement.py)."""
        on = OnDevice(cls(*args, **kw), dev)
        on.context.place = on.move
        return on.context

    @property
    def dev(self) -> torch.device:
        """Where the harness computes: its parameters' device."""
        return next(iter(self.theta.values())).device

    @property
    def n_bn(self) -> int:
        return self.table.xi.shape[1]

    @property
    def n_params(self) -> int:
        return len(self.theta)

    def client(self, c: int) -> Client:
        return Client(c, self.part.client(c), self.table.client_bn(c))

    def global_accuracy(self, client: Client) -> float:
        """The pretrained model's test accuracy on the client (no fine-tuning): computed now, or read with its
        group's (`prefetch`)."""
        if (client.id, "global") not in self.plain:
            self.plain[client.id, "global"] = global_accuracy(self.model, self.state, *client.data.test)
            self.model.eval()
        return self.plain[client.id, "global"]

    def finetune(self, client: Client, strategy: Strategy, seed: int) -> Trial:
        """`epochs` of fine-tuning of the pretrained parameters under `strategy` (placed on the device), batches from
        the client's stream for `seed`."""
        # keyed only where `prefetch` left work; from the strategy as recorded (on the host): no device read
        key = (client.id, seed, strategy_key(strategy)) if self.ready or self.scored else None
        s = self.place(strategy)
        ft = self.ready.pop(key, None) if key is not None else None
        return Trial(self, client, s, self._one(client, s, seed) if ft is None else ft, key=key)

    def _one(self, client: Client, s: Strategy, seed: int) -> FinetuneResult:
        return finetune(self.model, self.theta, *client.data.train, s, client.bn0, self.epochs, self.batch_size,
                        batches(seed, client.id), self.client_bn)

    def prefetch(self, wanted: list[tuple[Client, Strategy, int]], groups: Any,
                 scores: tuple[tuple[str, str], ...] = ()) -> None:
        """Compute the fine-tunings `wanted` (client, strategy, seed) ahead, in vmapped groups (`groups`, an
        engine.batched.Groups); `finetune` then takes each from here once, the same fine-tuning to float rounding.
        `scores`: the (split, statistics) pairs each will be evaluated on, computed on the device and read to the host
        in one read for the whole group (a trial's `evaluate` finds them; the same floats as evaluating it alone)."""
        todo: dict[tuple, tuple[Client, Strategy, int]] = {}
        for client, strategy, seed in wanted:
            todo.setdefault((client.id, seed, strategy_key(strategy)), (client, self.place(strategy), seed))
        for bn_i in (False, True):  # BN I (no beta) and mixed strategies cannot share a vmapped group
            keys = [k for k, (_, s, _) in todo.items() if (s.beta is None) == bn_i]
            for k, ft in zip(keys, groups.run([todo[k] for k in keys], self._group)):
                self.ready[k] = ft
        if scores:
            clients = {c.id: c for c, _, _ in todo.values()}
            self._score({k: (c, s, self.ready[k]) for k, (c, s, _) in todo.items()}, scores, list(clients.values()))

    def _score(self, fts: dict[tuple, tuple[Client, Strategy, FinetuneResult]], scores: tuple[tuple[str, str], ...],
               clients: list[Client]) -> None:
        """Every fine-tuning's (loss, accuracy) on each (split, statistics), each client's without fine-tuning on
        each split (`unadapted`) and the pretrained model's own test accuracy (`global_accuracy`), in one host read
        for all of them."""
        at = [(k, split, stats) for k in fts for split, stats in dict.fromkeys(scores)]
        plain = [(c, split) for c in clients for split in dict.fromkeys(split for split, _ in scores)
                 if (c.id, split) not in self.plain]
        glob = [c for c in clients if (c.id, "global") not in self.plain and len(c.data.test[1])]
        sums = self._sums(fts, at)
        sums += [torch.stack([v.double() for v in evaluate_sums(self.model, self.theta, *getattr(c.data, split))])
                 for c, split in plain]
        sums += [global_correct(self.model, self.state, *c.data.test).double().expand(2) for c in glob]
        self.model.eval()
        if not sums:
            return
        values = torch.stack(sums).tolist()
        for (k, split, stats), v in zip(at, values):
            self.scored[k, split, stats] = per_sample(v, len(getattr(fts[k][0].data, split)[1]))
        for (c, split), v in zip(plain, values[len(at):]):
            self.plain[c.id, split] = per_sample(v, len(getattr(c.data, split)[1]))
        for c, v in zip(glob, values[len(at) + len(plain):]):
            self.plain[c.id, "global"] = int(v[1]) / len(c.data.test[1])  # global_accuracy's arithmetic

    def _sums(self, fts: dict[tuple, tuple[Client, Strategy, FinetuneResult]], at: list[tuple[tuple, str, str]]
              ) -> list[Tensor]:
        """`personalized_sums` of each (fine-tuning, split, statistics) in `at`, on the device: those under the
        paper's inference (a beta mixing the client's running statistics) as one vmapped computation, the rest (batch
        statistics: BN I, --eval-stats test-batch) one at a time."""
        vmapped = [i for i, (k, _, stats) in enumerate(at) if stats == "running" and fts[k][1].beta is not None]
        out: dict[int, Tensor] = {}
        if len(vmapped) > 1:
            rows = [(fts[at[i][0]], at[i][1]) for i in vmapped]
            out = dict(zip(vmapped, scores_many(self.model, [ft.params for (_, _, ft), _ in rows],
                                                [getattr(c.data, split) for (c, _, _), split in rows],
                                                [cast(Tensor, s.beta) for (_, s, _), _ in rows],
                                                [ft.bn for (_, _, ft), _ in rows])))
        for i, (k, split, stats) in enumerate(at):
            if i not in out:
                client, s, ft = fts[k]
                x, y = getattr(client.data, split)
                out[i] = personalized_sums(self.model, ft.params, x, y, s, ft.bn, self.batch_size, stats)
        return [out[i] for i in range(len(at))]

    def unadapted(self, client: Client, split: str) -> tuple[float, float]:
        """(loss, accuracy) of the pretrained parameters on the client's `split`: the same for every seed and row,
        computed once (or read with its group's, `prefetch`)."""
        if (client.id, split) not in self.plain:
            self.plain[client.id, split] = evaluate(self.model, self.theta, *getattr(client.data, split))
        return self.plain[client.id, split]

    def forget(self) -> None:
        """Drop what `prefetch` computed and nobody asked for (a method that asked for less than it named)."""
        self.ready.clear()
        self.scored.clear()

    def _group(self, items: list[tuple[Client, Strategy, int]]) -> list[FinetuneResult]:
        if len(items) == 1:
            return [self._one(*items[0])]
        # read=False: nothing here reads the training losses, and the scores are read once for the set (`_score`)
        return finetune_many(self.model, [self.theta] * len(items), [c.data.train[0] for c, _, _ in items],
                             [c.data.train[1] for c, _, _ in items], [s for _, s, _ in items], [c.bn0 for c, _, _ in items],
                             self.epochs, self.batch_size, [batches(seed, c.id) for c, _, seed in items], self.client_bn,
                             read=False)


def strategy_key(s: Strategy) -> tuple:
    """A strategy's identity (its values): two requests for the same fine-tuning of a client and seed share it. Read
    from the strategy as a method recorded it, on the host (placed on a GPU, it would wait for the device)."""
    return (None if s.beta is None else tuple(s.beta.tolist()), tuple(s.lr.tolist()))


@dataclass
class ClientRun:
    """One client and seed of a personalisation (`setup`: its config), with the strategies its rows recorded for the
    client (on the CPU). Hand-made fine-tunings are computed once and shared: a tuned method's candidates include
    the hand-made strategies at their own LR, the same fine-tuning on the same batches as their rows."""
    setup: Any
    harness: Harness
    client: Client
    seed: int
    strategies: dict[str, Strategy | None]
    trials: dict = field(default_factory=dict)

    def handmade(self, method: Any, factor: float) -> Trial:
        """Fine-tuning under a hand-made method's strategy at `factor` x its LR."""
        key = (method.name, factor)
        if key not in self.trials:
            self.trials[key] = self.harness.finetune(self.client, self.handmade_strategy(method, factor), self.seed)
        return self.trials[key]

    def handmade_strategy(self, method: Any, factor: float) -> Strategy:
        """A hand-made method's strategy at `factor` x its LR, for this harness's model."""
        return method.fixed(factor, self.setup.cfg.base_lr, self.harness.n_bn, self.harness.n_params, self.harness.model)

    def unadapted(self, split: str) -> tuple[float, float]:
        """(loss, accuracy) of the pretrained parameters on the client's `split`, without fine-tuning."""
        return self.harness.unadapted(self.client, split)

    def learned(self, row: Any) -> Trial | None:
        """Fine-tuning under the strategy a learned row recorded for this client (None: it has none)."""
        s = self.strategies.get(row.name)
        return None if s is None else self.finetune(s)

    def finetune(self, strategy: Strategy) -> Trial:
        """Fine-tuning under any strategy, on the client's batches for the seed; computed once per strategy (a
        learned row and its check at x1 ask for the same one)."""
        key = strategy_key(strategy)  # the strategy as a method recorded it, on the host
        if key not in self.trials:
            self.trials[key] = self.harness.finetune(self.client, strategy, self.seed)
        return self.trials[key]

    def system(self, row: Any) -> float:
        """Another system's test accuracy on this client (its own models; NaN where it has none for the client)."""
        from ..methods.registry import system_trainer
        t = row.payload  # the pfl row's reader's `Trained`
        return system_trainer(t.algo, self.setup.catalog).accuracy(t, self.client.id, self.client.data, self.seed,
                                                                   self.setup.cfg.pfl_steps)
