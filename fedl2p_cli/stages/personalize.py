"""`fedl2p personalize`: every client of a pool fine-tunes the global model under each method; test accuracy.

Each requested method is a row; its kind (methods/registry.py: hand-made, tuned, learned, another system) resolves
the artifact it needs, personalises one client with one seed and says what it records. `evaluate_pool` is one loop
over clients, seeds and rows on the personalisation harness (stages/harness.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np
import torch

from .. import methods, protocols
from .. import stage_table as table
from ..algorithms.fedl2p import MetaConfig, hyper_fn
from ..analysis import per_kind, picks, spread
from ..analysis.personalized import behind_lines, beta_table, fixed, kind_tables, markdown, roles, row_cells, spread_lines  # noqa: F401 (the command's)
from ..artifacts import Artifact, Draft, Store
from ..catalog import Catalog
from ..configs import PersonalizeConfig, config_from_dict
from ..core import metanets
from ..core.config import validate, variant_words
from ..core.finetune import Strategy
from ..engine.loop import group_of
from ..engine.placement import OnDevice
from ..errors import FedL2PError
from ..io import results_h5
from ..io.stats_h5 import StatsTable
from ..runtime import Runtime
from .common import NoProgress, Progress, build_or_reuse, config_dict
from .harness import ClientRun, Harness
from .interface import Inputs, Planned, SectionFile, StageContext, parents_of
from .rows import META_TRAIN, PARTITION, PFL, PRETRAIN, STATS, Personalized

# rows in this order: no artifact (hand-made, tuned), then each stage whose artifacts are methods (learned, other systems)
METHOD_STAGES = (None, *(s.name for s in table.TABLE.rows if s.method))


@dataclass
class MetaNets:
    """A learned variant's meta-nets: lambda (per client with L2P), its settings and how its run mapped a client's
    statistics to the nets' inputs (its --input-norm entry with its fitted state; None: the raw statistics)."""
    lam: dict
    meta: MetaConfig
    map_inputs: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None
    per_client: bool
    head: Any = None  # its --head entry (protocols.MetaHead; None: the built-in of meta.head)
    initial: Callable[[int, int, int], dict] | None = None  # its run's lambda at round 0 from (n_bn, n_x, n_params)


@dataclass
class Row:
    """One row of a personalisation: its name in the results, its method's kind, the artifact it comes from (stage,
    id) and what its kind prepared from it (a learned variant's MetaNets, a system's trained models)."""
    name: str
    method: protocols.Method
    artifact: tuple[str, str] | None = None
    payload: Any = None


def check(cfg: PersonalizeConfig) -> None:
    validate(cfg)
    if not cfg.seeds:
        raise FedL2PError("--seeds must list at least one seed")
    if len(set(cfg.methods)) != len(cfg.methods):
        raise FedL2PError("--methods lists a method twice")


def check_shapes(art: Artifact, lam: dict, t: StatsTable, widths: tuple[int, int]) -> None:
    """lambda fits this model: its nets' shapes for the inputs' `widths` (BNNet's, LRNet's) and t's tensors."""
    want = metanets.shapes(*widths, len(t.param_names))  # what this model's meta-nets must be
    for k, v in lam.items():
        key = k.split(".", 1)[1] if k.startswith("client") else k
        if key in want and tuple(v.shape) != want[key]:
            raise FedL2PError(f"meta-nets {art.id} were trained for another model shape ({key} is {tuple(v.shape)}, "
                              f"this model needs {want[key]})")


@dataclass
class Setup:
    """A personalisation being prepared: its config, the artifacts it reads and the device the rows' models go to.
    The method kinds ask it for what they need (`newest_meta`, `meta_row`, ...): the one place that meets the store."""
    cfg: PersonalizeConfig
    inputs: Inputs  # the step's inputs: how it reads the artifacts the methods ask for
    pretrain_id: str
    stats_id: str
    partition_id: str
    table: StatsTable
    dev: torch.device
    catalog: Catalog  # the stage's: the methods, and the systems its rows evaluate
    model: torch.nn.Module | None = None  # the harness's model, once it is built (a hand-made method's tensors read it)

    @property
    def pool(self) -> str:
        return "unseen" if self.cfg.unseen else "seen"

    @property
    def n_bn(self) -> int:
        return self.table.xi.shape[1]

    @property
    def n_params(self) -> int:
        return len(self.table.param_names)

    def row(self, name: str, method: protocols.Method, art: Artifact | None = None, payload: Any = None) -> Row:
        return Row(name, method, None if art is None else (art.stage, art.id), payload)

    def rows(self, refs: dict[str, list[str]]) -> list[Row]:
        """Every row, in the results' order: per stage (METHOD_STAGES), the artifacts given by id (--meta, --pfl), then the
        requested methods of that stage no given artifact stands for. A later row of the same name replaces an
        earlier one in its place."""
        out: list[Row] = []
        for stage in METHOD_STAGES:
            given = [self.inputs.at(stage, r).artifact for r in refs.get(stage, [])] if stage else []
            rows = [_own(method_of(a, self.catalog).prepare(self, a)) for a in given]
            rows += [_own(kind.prepare(self, a)) for a in given for m in self.cfg.methods  # a checked row beside its own
                     if isinstance(kind := self.find(m), methods.Checked) and stands_for(a, m, self.catalog)]
            twice = [(a.id, b.id, r.name) for i, (a, r) in enumerate(zip(given, rows))
                     for b, q in zip(given[:i], rows[:i]) if q.name == r.name]
            if twice:  # one row per name: the later would silently replace the earlier
                flag = "--pfl" if stage == "pfl" else "--meta"
                raise FedL2PError(f"{flag}: {twice[0][1]} and {twice[0][0]} are both '{twice[0][2]}'; a personalisation "
                                  "compares one artifact per method (run personalize once per artifact)")
            out += rows
            for m in self.cfg.methods:
                kind = self.find(m)
                if (kind.trained_by if kind else "meta-train") == stage and not any(stands_for(a, m, self.catalog)
                                                                                    for a in given):
                    out.append(self.requested(m, kind))
        return list({r.name: r for r in out}.values())

    def requested(self, m: str, kind: protocols.Method | None) -> Row:
        """The row of a requested name: a registered method's, or a learned variant's (its newest artifact, whose
        options say which learned method it belongs to)."""
        if kind is None:
            art = self.newest_meta(m)
            return _own(method_of(art, self.catalog).prepare(self, art))
        return _own(kind.prepare(self, kind.resolve(self, m)))

    def find(self, name: str) -> protocols.Method | None:
        """The method or system registered as `name` in this personalisation's catalog (None: a learned variant's)."""
        return methods.find(name, self.catalog)

    def method(self, name: str) -> protocols.Method:
        """The method registered as `name` (a tuned method's candidates); `UnknownName` naming the choices if none."""
        return methods.get(name, self.catalog)

    def unknown(self, m: str) -> str:
        # a system whose plugin is not loaded: loading its artifact (verified) names the plugin to load
        self.inputs.newest("pfl", lambda a: a.config.get("algo") == m)
        have = sorted({cast(str, a.metrics.get("variant")) for a in self.inputs.stored("meta-train")
                       if a.parents.get("pretrain") == self.pretrain_id})
        hint = (f"; this model's trained variants: {', '.join(have)} (name one in --methods, or pass --meta ID)"
                if have else "; run `fedl2p meta-train` first")
        return (f"unknown method '{m}': not a hand-made method ({', '.join(methods.handmade(self.catalog))}), not a "
                f"system ({', '.join(methods.systems(self.catalog))}) and no meta-train artifact of that variant for pretrained model "
                f"{self.pretrain_id}{hint}")

    def newest_learned(self, family: str) -> Artifact:
        """The newest meta-train artifact of a learned family (`fedl2p`: any FedL2P variant, `l2p`: any L2P run)
        learned on these clients' statistics, else of this model: what a learned method's name in --methods means."""
        def mine(a: Artifact) -> bool:
            return a.stage == "meta-train" and learned_family(a) == family
        hit = (self.inputs.newest("meta-train", lambda a: mine(a) and a.parents.get("stats") == self.stats_id)
               or self.inputs.newest("meta-train", lambda a: mine(a) and a.parents.get("pretrain") == self.pretrain_id))
        if hit is None:
            raise FedL2PError(self.unknown(family))
        return hit.artifact

    def newest_meta(self, variant: str) -> Artifact:
        """The newest meta-train artifact of `variant` learned on these clients' statistics, else of this model."""
        hit = (self.inputs.newest("meta-train", lambda a: a.metrics.get("variant") == variant and a.parents.get("stats") == self.stats_id)
               or self.inputs.newest("meta-train", lambda a: a.metrics.get("variant") == variant
                                     and a.parents.get("pretrain") == self.pretrain_id))
        if hit is None:
            raise FedL2PError(self.unknown(variant))
        return hit.artifact

    def meta_row(self, method: methods.Learned, art: Artifact) -> Row:
        got = self.inputs.at(META_TRAIN, art.id).value  # the meta-train row's reader: lambda, settings, head
        check_shapes(art, got.lam, self.table, got.widths(self.table))
        nets = MetaNets(got.lam, got.cfg.meta, got.inputs, got.cfg.local, got.head, got.initial)
        # the personalisation's own declared tags (--eval-stats test-batch: -tbs) follow the meta-train variant's name
        return self.row("-".join([art.metrics["variant"], *variant_words(self.cfg)]), method, art, nets)

    def round0_control(self, row: Row, clients: list[int], domain: np.ndarray) -> dict | None:
        """A learned row's spread across these clients under its meta-train run's initial lambda (re-drawn from its
        seed): the split that was there before any training. None for a row of per-client lambdas (L2P)."""
        nets = row.payload
        if not isinstance(nets, MetaNets) or nets.per_client or nets.initial is None:
            return None
        inputs = [self.nets_inputs(nets, c) for c in clients]
        lam0 = nets.initial(self.n_bn, inputs[0][1].shape[0], self.n_params) if inputs else {}
        outs = []
        with torch.no_grad():
            for xi, x in inputs:
                outs.append(hyper_fn(xi, x, self.n_params, nets.meta, nets.head)(lam0))
        return spread.spread(torch.stack([o[0] for o in outs]).numpy(), torch.stack([o[1] for o in outs]).numpy(), domain)

    def nets_inputs(self, nets: MetaNets, c: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Client c's meta-net inputs, as the nets' run mapped its clients' statistics."""
        xi, x = self.table.inputs(c)
        return nets.map_inputs(xi, x) if nets.map_inputs is not None else (xi, x)

    def learned_strategy(self, row: methods.registry.Row, c: int) -> Strategy | None:
        """A learned row's strategy for client c, from its meta-nets and c's statistics (None: it has none for c, e.g.
        L2P for a client it never trained)."""
        nets: MetaNets = row.payload
        if not row.method.supports(self.pool):
            return None
        lam = group_of(nets.lam, f"client{c}") if nets.per_client else nets.lam
        if not lam:
            return None
        xi, x = self.nets_inputs(nets, c)
        with torch.no_grad():
            beta, eta = hyper_fn(xi, x, self.n_params, nets.meta, nets.head)(lam)
        return Strategy(beta, eta)

    def newest_pfl(self, algo: str) -> Artifact:
        hit = self.inputs.newest("pfl", lambda a: a.config.get("algo") == algo and a.parents.get("partition") == self.partition_id,
                                 verify=False)
        if hit is None:
            raise FedL2PError(f"method '{algo}' has no pfl artifact for partition {self.partition_id}; run `fedl2p pfl-train "
                              f"--algo {algo}` first")
        return hit.artifact

    def pfl_row(self, method: methods.System, art: Artifact) -> Row:
        if art.parents.get("partition") != self.partition_id:
            raise FedL2PError(f"pfl artifact {art.id} was trained on partition {art.parents.get('partition')}, not {self.partition_id}")
        return self.row(method.name, method, art, OnDevice(self.inputs.at(PFL, art.id).value, self.dev).context)


def _own(row: methods.registry.Row) -> Row:
    """A row a method prepared: one this stage's Setup made (`row`, `meta_row`, `pfl_row`), so a Row of this module."""
    return cast("Row", row)


def _context(run: ClientRun) -> methods.registry.ClientContext:
    """A ClientRun as the ClientContext methods see (its `client`, a harness Client, is a context Client with more)."""
    return cast("methods.registry.ClientContext", run)


def canonical(rows: list[Row], catalog: Catalog) -> list[Row]:
    """Rows in one order whatever order --methods gave: per stage (METHOD_STAGES), methods needing no artifact in the
    registry's order, the others by name (the pipelines' lists are in this order already: their ids are kept)."""
    order = {m: i for i, m in enumerate(methods.names(catalog))}
    return sorted(rows, key=lambda r: (METHOD_STAGES.index(r.artifact[0] if r.artifact else None),
                                       order.get(r.name, len(order)) if r.artifact is None else 0, r.name))


def learned_family(art: Artifact) -> str:
    """The learned family (methods.Learned.family) a meta-train artifact belongs to, from its stored settings."""
    return config_from_dict(art.config).family()


def method_of(art: Artifact, catalog: Catalog) -> protocols.Method:
    """The method an artifact given by id belongs to: a meta-train artifact's learned family, a pfl one's system."""
    if art.stage == "meta-train":
        return methods.learned(learned_family(art), catalog)  # type: ignore[return-value]  # every family is registered
    return methods.get(art.config["algo"], catalog)


def stands_for(art: Artifact, name: str, catalog: Catalog) -> bool:
    """A requested name that an artifact given by id answers: its own name (variant, algorithm) or the learned method
    it belongs to (`--methods fedl2p --meta ID` of any FedL2P variant: a method's name means its newest run, and
    ID is the run asked for)."""
    own = art.metrics.get("variant") if art.stage == "meta-train" else art.config.get("algo")
    kind = methods.find(name, catalog)
    checked = isinstance(kind, methods.Checked) and art.stage == "meta-train" and learned_family(art) == kind.family
    return name == own or method_of(art, catalog) is kind or checked


def evaluate_pool(setup: Setup, h: Harness, rows: list[Row], clients: list[int], progress: Progress,
                  groups: Any = None) -> results_h5.Results:
    """Every row personalises every client with every seed on the harness; each row's kind says how and what it
    records (its strategy's beta and per-tensor LR, a tuned method's candidates). `groups` (an engine.batched.Groups,
    --client-batch > 1): the fine-tunings of as many clients as fill a group of `groups.size` (every seed and row of
    each), computed ahead as vmapped groups; the same results to float rounding."""
    cfg, names = setup.cfg, [r.name for r in rows]
    acc = np.full((len(rows), len(cfg.seeds), len(clients)), np.nan)
    beta = {m: np.full((len(clients), setup.n_bn), np.nan, dtype=np.float32) for m in names}
    eta = {m: np.full((len(clients), setup.n_params), np.nan, dtype=np.float32) for m in names}
    sparsity = {m: np.full(len(clients), np.nan) for m in names}
    cand: dict[tuple[int, int], np.ndarray] = {}
    checked: dict[str, dict[tuple[int, int], np.ndarray]] = {}  # a checked row's trials, to tell what it picked
    before = np.zeros(len(clients))
    sizes = torch.tensor([v.numel() for v in h.theta.values()], dtype=torch.float64)
    progress.start(f"personalize ({setup.pool} clients)", len(clients) * len(cfg.seeds))
    pairs, first = list(enumerate(clients)), 0
    while first < len(clients):
        runs: dict[tuple[int, int], ClientRun] = {}
        wanted: list[tuple[Any, Strategy, int]] = []
        # clients join the prefetch until its fine-tunings fill a group: every seed and row of a client is many
        # fine-tunings, and all of them are held until scored, so `groups.size` clients would hold far more than the
        # group size `auto` planned for
        while first < len(clients) and (not runs or (groups is not None and len(wanted) < (groups.size or 1))):
            j, c = pairs[first]
            first += 1
            client = h.client(c)
            strategies = {r.name: r.method.strategy(r, setup, c) for r in rows}  # on the CPU, where they are recorded
            for m, s in strategies.items():
                if s is not None:
                    beta[m][j] = np.nan if s.beta is None else s.beta.numpy()
                    eta[m][j] = s.lr.numpy()
                    sparsity[m][j] = float((sizes * (s.lr == 0)).sum() / sizes.sum())
            mine = {(j, k): ClientRun(setup, h, client, seed, strategies) for k, seed in enumerate(cfg.seeds)}
            runs |= mine
            if groups is not None:
                wanted += [(run.client, s, run.seed) for run in mine.values() for r in rows
                           for s in r.method.wants(r, _context(run))]
        if groups is not None:  # the clients' fine-tunings, every row's, computed ahead in vmapped groups
            h.prefetch(wanted, groups, scored_on(cfg))
        for (j, k), run in runs.items():
            before[j] = h.global_accuracy(run.client)  # read with the prefetch's scores where there was one
            for i, r in enumerate(rows):
                out = r.method.personalize(r, _context(run))
                acc[i, k, j] = out.acc
                if out.candidates is not None and isinstance(r.method, methods.Checked):
                    checked.setdefault(r.name, {})[k, j] = out.candidates
                elif out.candidates is not None:
                    cand[k, j] = out.candidates
            progress.advance(1)
        h.forget()  # a method that asked for less than it named leaves nothing behind
    progress.stop()
    return results_h5.Results(names, list(cfg.seeds), setup.pool, np.array(clients), h.part.domain[clients], before, acc,
                              beta, eta, sparsity, {"epochs": cfg.epochs, "base_lr": cfg.base_lr, "client_bn": cfg.client_bn,
                                                    "eval_stats": cfg.eval_stats}, stacked(cand, len(cfg.seeds), len(clients)),
                              {m: cast(np.ndarray, stacked(v, len(cfg.seeds), len(clients))) for m, v in checked.items()})


def scored_on(cfg: PersonalizeConfig) -> tuple[tuple[str, str], ...]:
    """The (split, statistics) pairs the built-in methods evaluate a fine-tuning on: a hand-made row and `ft-tuned`'s
    candidates at the running statistics, a learned row and its check at `--eval-stats`; validation and test each."""
    return tuple(dict.fromkeys((split, stats) for stats in ("running", cfg.eval_stats) for split in ("val", "test")))


def stacked(cand: dict[tuple[int, int], np.ndarray], seeds: int, clients: int) -> np.ndarray | None:
    """A tuned row's candidate scores per (seed, client) as one [seeds, clients, candidates, 3] array (None: no tuned
    row)."""
    if not cand:
        return None
    out = np.full((seeds, clients, *next(iter(cand.values())).shape), np.nan)
    for (k, j), v in cand.items():
        out[k, j] = v
    return out


def summarize(r: results_h5.Results, domain_names: list[str], catalog: Catalog,
              controls: dict[str, dict] | None = None) -> dict:
    """Paper layout: per method, mean over clients, then mean and SD over seeds; also per domain. `controls`: a learned
    row's spread under its initial lambda (the round-0 control), printed beside its own; a checked row's picks and
    ft-tuned's picks at its grid's edge, per kind. `catalog`: what each row's method is."""
    rows: dict[str, dict[str, Any]] = {}
    for i, m in enumerate(r.methods):
        per_seed = np.nanmean(r.acc_after[i], axis=1) if not np.isnan(r.acc_after[i]).all() else np.full(len(r.seeds), np.nan)
        learned = not fixed(m, catalog) and not np.isnan(r.sparsity[m]).all()
        rows[m] = {"mean": float(np.mean(per_seed)), "sd": float(np.std(per_seed)),
                   "sparsity": float(np.nanmean(r.sparsity[m])) if learned else None,
                   "per_domain": {domain_names[d]: float(np.nanmean(r.acc_after[i][:, r.domain == d]))
                                  for d in np.unique(r.domain) if not np.isnan(r.acc_after[i][:, r.domain == d]).all()}}
    for m in r.methods:
        if not fixed(m, catalog) and not np.isnan(r.beta[m]).all():
            rows[m]["beta_per_domain"] = {domain_names[d]: [float(v) for v in np.nanmean(r.beta[m][r.domain == d], axis=0)]
                                          for d in np.unique(r.domain)}
        if not fixed(m, catalog) and not m.endswith(methods.registry.CHECKED) and not np.isnan(r.eta[m]).all():
            # a learned row: are its strategies personal? (its checked row has the same ones)
            rows[m]["spread"] = spread.spread(r.beta[m], r.eta[m], r.domain)
            if controls and m in controls:
                rows[m]["spread_round0"] = controls[m]
    for m, trials in r.checked.items():
        rows[m]["picks"] = picks.checked(trials, r.domain, domain_names)
    tuned = next((m for m in r.methods if isinstance(methods.find(m, catalog), methods.Tuned)), None)
    if tuned is not None and r.candidates is not None:
        rows[tuned]["edge"] = picks.tuned_edge(r.candidates, r.domain, domain_names)
    base = [m for m in r.methods if m in methods.baselines(catalog)]
    out = {"pool": r.pool, "clients": len(r.client), "seeds": r.seeds, "global_acc": float(r.acc_before.mean()), "methods": rows}
    best = max(base, key=lambda m: rows[m]["mean"]) if base else None
    if best is not None:
        out["best_baseline"] = best
    best_acc, tuned_acc = references(r, best, catalog)
    for i, m in enumerate(r.methods):
        if m not in base and not np.isnan(r.acc_after[i]).all():
            rows[m] |= deltas(r.acc_after[i], best_acc, None if m in methods.handmade(catalog) else tuned_acc)
    if pk := kind_summary(r, domain_names, catalog):
        out["per_kind"] = pk
    return out


def kind_summary(r: results_h5.Results, domain_names: list[str], catalog: Catalog) -> dict:
    """The per-kind table (analysis/per_kind.py) of a personalisation with more than one kind of client, else {}."""
    return per_kind.table(r.methods, r.acc_after, r.domain, domain_names, roles(r.methods, catalog))


def references(r: results_h5.Results, best: str | None, catalog: Catalog) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The accuracies [seeds, clients] that other rows are paired against: the best baseline's (named) and the tuned
    row's (None where the personalisation has none)."""
    tuned = next((m for m in r.methods if isinstance(methods.find(m, catalog), methods.Tuned)), None)
    return (None if best is None else r.acc_after[r.methods.index(best)],
            None if tuned is None else r.acc_after[r.methods.index(tuned)])


def deltas(acc: np.ndarray, best: np.ndarray | None, tuned: np.ndarray | None) -> dict[str, float]:
    """A row's paired differences ([seeds, clients], the same clients, seeds and batches): vs the best baseline (mean
    over clients of each client's mean over seeds) with the share of clients it helps, and vs the tuned row."""
    out = {}
    if best is not None:
        diff = np.nanmean(acc - best, axis=0)  # per client, over seeds
        out["vs_best_baseline"] = float(np.nanmean(diff))
        out["clients_better"] = float(np.mean(diff[~np.isnan(diff)] > 0))
    if tuned is not None:
        out["vs_ft_tuned"] = float(np.nanmean(acc - tuned))
    return out


def plots(r: results_h5.Results, table: StatsTable, draft: Draft, catalog: Catalog) -> None:
    from ..analysis.plots import bar, hyperparam_boxes
    for m in r.methods:
        if fixed(m, catalog) or np.isnan(r.eta[m]).all():
            continue
        ok = ~np.isnan(r.eta[m]).any(axis=1)
        hyperparam_boxes(r.beta[m][ok], [f"bn{i}" for i in range(r.beta[m].shape[1])], f"{m}: beta per BN layer", "beta",
                         draft.path(f"beta_{m}.png"))
        hyperparam_boxes(r.eta[m][ok], table.param_names, f"{m}: learning rate per tensor", "eta",
                         draft.path(f"eta_{m}.png"), log=True)
    sp = {m: float(np.nanmean(r.sparsity[m])) for m in r.methods
          if not fixed(m, catalog) and not np.isnan(r.sparsity[m]).all()}
    if sp:
        bar(sp, "share of parameters with learning rate 0", "sparsity", draft.path("sparsity.png"))


def execute(cfg: PersonalizeConfig, inputs: Inputs, ctx: StageContext) -> tuple[Artifact, bool]:
    """Every client of the pool fine-tuned under each method -> results.h5, summaries, plots. Reads the `pretrain`ed
    model (default: the one its `stats` name, else the newest), its `stats`, and the `meta-train` and `pfl` runs
    whose methods join the table: a planned meta-train run whose method cannot personalise this pool is left out, one
    the user named (`meta`, --meta) is kept (its row says N/A)."""
    check(cfg)
    default = None
    if inputs.one("pretrain") is None and inputs.one("stats") is not None:  # the statistics name their model
        default = inputs.get(STATS, verify=False).artifact.parents["pretrain"]
    pre = inputs.get(PRETRAIN, default)
    stats_in = inputs.made_from(STATS, PRETRAIN, pre.artifact.id, "pretrained model")
    table: StatsTable = stats_in.value
    parents = {"partition": stats_in.artifact.parents["partition"], "pretrain": pre.artifact.id, "stats": stats_in.artifact.id}
    setup = Setup(cfg, inputs, pre.artifact.id, stats_in.artifact.id, parents["partition"], table, ctx.runtime.torch_device,
                  ctx.catalog)
    pool = "unseen" if cfg.unseen else "seen"
    metas = [r.artifact.id for r in inputs.every(META_TRAIN, verify=False)
             if method_of(r.artifact, ctx.catalog).supports(pool)]
    rows = canonical(setup.rows({"meta-train": metas + inputs.many("meta"), "pfl": inputs.many("pfl")}), ctx.catalog)
    parents |= {f"{r.artifact[0]}:{r.name}": r.artifact[1] for r in rows if r.artifact}
    part = stats_in.parent(PARTITION).value
    clients = part.pool(cfg.unseen)
    if not clients:
        raise FedL2PError(f"the {setup.pool} pool of partition {parents['partition']} is empty")

    def build(draft: Draft) -> None:
        model, state = pre.value
        h = Harness.on(setup.dev, model, state, part, table, cfg.epochs, cfg.batch_size, cfg.client_bn)
        # a method fine-tuning nothing: refused
        methods.registry.before_personalizing([r.method for r in rows], h.model, ctx.catalog)
        r = evaluate_pool(replace(setup, model=h.model), h, rows, clients, ctx.progress or NoProgress(),
                          client_groups(ctx.runtime, len(clients)))
        results_h5.write(draft.path("results.h5"), r)
        controls = {r_.name: c for r_ in rows if not r_.name.endswith(methods.registry.CHECKED)  # a checked row's are its row's
                    and (c := setup.round0_control(r_, clients, part.domain[clients]))}
        s = summarize(r, part.domain_names, ctx.catalog, controls)
        draft.path("summary.json").write_text(json.dumps(s, indent=2))
        draft.path("summary.md").write_text(markdown(s, ctx.catalog))
        plots(r, table, draft, ctx.catalog)
        draft.metrics = {"pool": s["pool"], "global_acc": s["global_acc"]} | {m: v["mean"] for m, v in s["methods"].items()}

    # the methods needing no artifact, in the registry's order: those with one are its parents (`--methods
    # ft-bnc,fedl2p-fomaml` stage by stage and a pipeline's methods plus its [[meta-train]] are one personalisation)
    ident = config_dict(cfg) | {"methods": [r.name for r in rows if r.artifact is None]}
    return build_or_reuse(ctx.store, "personalize", ident, parents, build, ctx.force, ctx.runtime)


def client_groups(runtime: Runtime, clients: int) -> Any:
    """--client-batch's groups for the batched personalisation (None: one client at a time, the CPU's `auto`)."""
    from ..engine.batched import Groups
    n = runtime.client_batch
    if n == "auto" and not runtime.on_gpu or n == 1:
        return None
    return Groups(runtime.torch_device, None if n == "auto" else int(n), clients)


def read(art: Artifact, catalog: Catalog | None = None) -> Personalized:
    """The stage's reader (its row's `reader`): the results an artifact holds and which of its rows were learned (a
    file and the artifact's parents: no catalog needed)."""
    r = results_h5.read(art.file("results.h5"))
    return Personalized(r, learned_rows(art, r))


def learned_rows(art: Artifact, r: results_h5.Results) -> list[str]:
    """The rows of a personalisation that a meta-train artifact made (learned variants), in its results' order."""
    return [m for m in r.methods if f"meta-train:{m}" in art.parents]


def load(store: Store, ref: str | None) -> tuple[Artifact, results_h5.Results]:
    """A personalize artifact (its newest for None) and its results: for code outside the stages (tests, benches)."""
    art = store.load("personalize", ref)
    return art, read(art).results


RUNTIME_KEYS = ("client_batch",)  # [personalize]'s runtime keys: how many clients' fine-tunings at once


def plan(file: SectionFile) -> list[Planned]:
    """One step per pool of [personalize] (`pools`, default seen); its `methods` are the hand-made and checked ones
    (the learned rows come from the file's [[meta-train]] and [[pfl]] runs)."""
    if "personalize" not in file.sections:
        return []
    values, own = file.runtime(file.table("personalize"), "personalize", RUNTIME_KEYS)
    values.pop("pools", None)
    if "unseen" in values:  # each pool's step sets it: a value here would be replaced without a word
        raise FedL2PError(f"pipeline {file.name}: [personalize] takes pools = [\"seen\", \"unseen\"], not unseen")
    handmade = values.pop("methods", list(methods.baselines(file.catalog)))
    allowed = methods.handmade(file.catalog) + methods.names(file.catalog, methods.Checked)  # checked: [[meta-train]]
    bad = [m for m in handmade if m not in allowed] if isinstance(handmade, list) else [handmade]
    if bad:
        raise FedL2PError(f"pipeline {file.name}: [personalize] methods lists '{bad[0]}'; hand-made and checked "
                          f"methods are: {', '.join(allowed)} (meta-net variants come from [[meta-train]])")
    parents = parents_of(table.stage("personalize"))
    return [Planned(f"personalize:{pool}", pool, "personalize",
                    file.config(PersonalizeConfig, "personalize",
                                values | {"unseen": pool == "unseen", "methods": list(handmade)},
                                also=(*RUNTIME_KEYS, "pools")), parents, own)
            for pool in pools(file)]


def pools(file: SectionFile) -> list[str]:
    """[personalize]'s pools (`pools`, default seen), checked: what its steps and [analyze] read."""
    got = file.table("personalize").get("pools", ["seen"])
    if not isinstance(got, list) or not got or any(x not in ("seen", "unseen") for x in got):
        raise FedL2PError(f"pipeline {file.name}: [personalize] pools must be a list of \"seen\" and/or \"unseen\", "
                          f"got {got!r}")
    return got
