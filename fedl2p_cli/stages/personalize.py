"""`fedl2p personalize`: every client of a pool fine-tunes the global model under each method; test accuracy."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import torch

from ..algorithms.fedl2p import hyper_fn
from ..algorithms.fedl2p import MetaConfig
from ..artifacts import Artifact, Draft, Store
from ..core.finetune import Strategy, finetune, personalized_accuracy
from ..engine.loop import generator
from ..errors import FedL2PError
from ..io import results_h5
from ..io.stats_h5 import StatsTable
from . import meta_train as meta_stage
from . import partition as partition_stage
from . import pretrain as pretrain_stage
from . import stats as stats_stage
from .common import NoProgress, Progress, build_or_reuse
from .pretrain import global_accuracy

BASELINES = ("ft-bnc", "ft-bng", "ft-bni")
LABELS = {"ft-bnc": "FT (BN C)", "ft-bng": "FT (BN G)", "ft-bni": "FT (BN I)"}


@dataclass
class PersonalizeConfig:
    unseen: bool = False
    methods: list[str] = field(default_factory=lambda: [*BASELINES, "fedl2p"])
    epochs: int = 5
    batch_size: int = 32
    base_lr: float = 1e-3
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])


@dataclass
class MetaMethod:
    name: str
    art_id: str
    lam: dict
    meta: MetaConfig


def check(cfg: PersonalizeConfig) -> None:
    if cfg.epochs <= 0 or cfg.batch_size < 2 or cfg.base_lr <= 0 or not cfg.seeds:
        raise FedL2PError("--epochs must be positive, --batch-size >= 2, --base-lr > 0 and --seeds non-empty")
    if len(set(cfg.methods)) != len(cfg.methods):
        raise FedL2PError("--methods lists a method twice")


def resolve_meta(store: Store, cfg: PersonalizeConfig, meta_refs: list[str], pretrain_id: str, table: StatsTable) -> list[MetaMethod]:
    """Meta-net artifacts by id, plus the newest artifact for any requested variant name (e.g. 'fedl2p')."""
    arts = [store.load("meta-train", r) for r in meta_refs]
    known = {a.metrics.get("variant") for a in arts}
    for m in cfg.methods:
        if m in BASELINES or m in known:
            continue
        cands = [a for a in store.iter("meta-train") if a.metrics.get("variant") == m and a.parents.get("pretrain") == pretrain_id]
        if not cands:
            raise FedL2PError(f"unknown method '{m}': not a baseline ({', '.join(BASELINES)}) and no meta-train artifact "
                              f"of that variant for pretrained model {pretrain_id}")
        arts.append(store.load("meta-train", max(cands, key=lambda a: a.manifest["created"]).id))
    out = []
    for a in arts:
        _, lam = meta_stage.load_lambda(store, a.id)
        check_shapes(a, lam, table)
        meta = MetaConfig(**a.config["meta"])
        out.append(MetaMethod(a.metrics["variant"], a.id, lam, meta))
    return out


def check_shapes(art: Artifact, lam: dict, t: StatsTable) -> None:
    b, x, p = t.xi.shape[1], t.x.shape[1], len(t.param_names)
    for k, v in lam.items():
        key = k.split(".", 1)[1] if k.startswith("client") else k
        want = {"bnnet.0.weight": (100, b), "bnnet.2.weight": (b, 100), "lrnet.0.weight": (100, x),
                "lrnet.2.weight": (p, 100), "eta": (p,)}.get(key)
        if want and tuple(v.shape) != want:
            raise FedL2PError(f"meta-nets {art.id} were trained for another model shape ({key} is {tuple(v.shape)}, "
                              f"this model needs {want})")


def strategies(cfg: PersonalizeConfig, metas: list[MetaMethod], c: int, table: StatsTable, n_bn: int,
               n_p: int) -> dict[str, Strategy | None]:
    lr = torch.full((n_p,), cfg.base_lr)
    out: dict[str, Strategy | None] = {}
    for m in cfg.methods:
        if m == "ft-bnc":
            out[m] = Strategy(torch.ones(n_bn), lr)
        elif m == "ft-bng":
            out[m] = Strategy(torch.zeros(n_bn), lr)
        elif m == "ft-bni":
            out[m] = Strategy(None, lr)
    xi, x = table.inputs(c)
    for mm in metas:
        lam = mm.lam
        if any(k.startswith("client") for k in lam):  # L2P: per-client lambda; none for clients it never saw
            prefix = f"client{c}."
            lam = {k[len(prefix):]: v for k, v in lam.items() if k.startswith(prefix)}
            if not lam:
                out[mm.name] = None
                continue
        with torch.no_grad():
            beta, eta = hyper_fn(xi, x, n_p, mm.meta)(lam)
        out[mm.name] = Strategy(beta, eta)
    return out


def evaluate_pool(cfg: PersonalizeConfig, store: Store, pre_id: str, part, table: StatsTable, metas: list[MetaMethod],
                  clients: list[int], progress: Progress) -> results_h5.Results:
    _, model, state = pretrain_stage.load(store, pre_id)
    theta_g = {n: state[n] for n, _ in model.named_parameters()}
    n_bn, n_p = table.xi.shape[1], len(theta_g)
    methods = list(dict.fromkeys([m for m in cfg.methods if m in BASELINES] + [mm.name for mm in metas]))
    acc = np.full((len(methods), len(cfg.seeds), len(clients)), np.nan)
    beta = {m: np.full((len(clients), n_bn), np.nan, dtype=np.float32) for m in methods}
    eta = {m: np.full((len(clients), n_p), np.nan, dtype=np.float32) for m in methods}
    sparsity = {m: np.full(len(clients), np.nan) for m in methods}
    before = np.zeros(len(clients))
    sizes = torch.tensor([v.numel() for v in theta_g.values()], dtype=torch.float64)
    progress.start(f"personalize ({'unseen' if cfg.unseen else 'seen'} clients)", len(clients) * len(cfg.seeds))
    for j, c in enumerate(clients):
        data = part.client(c)
        before[j] = global_accuracy(model, state, *data.test)
        strat = strategies(cfg, metas, c, table, n_bn, n_p)
        for i, m in enumerate(methods):
            s = strat.get(m)
            if s is None:
                continue
            beta[m][j] = np.nan if s.beta is None else s.beta.numpy()
            eta[m][j] = s.lr.numpy()
            sparsity[m][j] = float((sizes * (s.lr == 0)).sum() / sizes.sum())
        for k, seed in enumerate(cfg.seeds):
            for i, m in enumerate(methods):
                s = strat.get(m)
                if s is None:
                    continue
                gen = generator(seed, c, 7)  # the same batch order for every method: a paired comparison
                ft = finetune(model, theta_g, *data.train, s, table.client_bn(c), cfg.epochs, cfg.batch_size, gen)
                acc[i, k, j] = personalized_accuracy(model, ft.params, *data.test, s, ft.bn, cfg.batch_size)[1]
            progress.advance(1)
    progress.stop()
    return results_h5.Results(methods, list(cfg.seeds), "unseen" if cfg.unseen else "seen", np.array(clients),
                              part.domain[clients], before, acc, beta, eta, sparsity,
                              {"epochs": cfg.epochs, "base_lr": cfg.base_lr})


def summarize(r: results_h5.Results, domain_names: list[str]) -> dict:
    """Paper layout: per method, mean over clients, then mean and SD over seeds; also per domain."""
    rows = {}
    for i, m in enumerate(r.methods):
        per_seed = np.nanmean(r.acc_after[i], axis=1) if not np.isnan(r.acc_after[i]).all() else np.full(len(r.seeds), np.nan)
        learned = m not in BASELINES and not np.isnan(r.sparsity[m]).all()
        rows[m] = {"mean": float(np.mean(per_seed)), "sd": float(np.std(per_seed)),
                   "sparsity": float(np.nanmean(r.sparsity[m])) if learned else None,
                   "per_domain": {domain_names[d]: float(np.nanmean(r.acc_after[i][:, r.domain == d]))
                                  for d in np.unique(r.domain) if not np.isnan(r.acc_after[i][:, r.domain == d]).all()}}
    for m in r.methods:
        if m not in BASELINES and not np.isnan(r.beta[m]).all():
            rows[m]["beta_per_domain"] = {domain_names[d]: [float(v) for v in np.nanmean(r.beta[m][r.domain == d], axis=0)]
                                          for d in np.unique(r.domain)}
    base = [m for m in r.methods if m in BASELINES]
    out = {"pool": r.pool, "clients": len(r.client), "seeds": r.seeds, "global_acc": float(r.acc_before.mean()), "methods": rows}
    if base:
        best = max(base, key=lambda m: rows[m]["mean"])
        out["best_baseline"] = best
        bi = r.methods.index(best)
        for i, m in enumerate(r.methods):
            if m not in BASELINES and not np.isnan(r.acc_after[i]).all():
                diff = np.nanmean(r.acc_after[i] - r.acc_after[bi], axis=0)  # per client, over seeds
                rows[m]["vs_best_baseline"] = float(np.nanmean(diff))
                rows[m]["clients_better"] = float(np.mean(diff[~np.isnan(diff)] > 0))
    return out


def markdown(s: dict) -> str:
    lines = [f"Personalised test accuracy, {s['pool']} clients ({s['clients']}), mean ± SD over seeds {s['seeds']}", "",
             "| method | accuracy (%) | Δ vs best FT | clients better | sparsity |", "|---|---|---|---|---|",
             f"| global model | {100 * s['global_acc']:.2f} | | | |"]
    for m, v in s["methods"].items():
        d = f"{100 * v['vs_best_baseline']:+.2f}" if "vs_best_baseline" in v else ""
        cb = f"{100 * v['clients_better']:.0f}%" if "clients_better" in v else ""
        sp = f"{v['sparsity']:.3f}" if v.get("sparsity") is not None else ""
        lines.append(f"| {LABELS.get(m, m)} | {100 * v['mean']:.2f} ± {100 * v['sd']:.2f} | {d} | {cb} | {sp} |")
    return "\n".join(lines) + "\n"


def plots(r: results_h5.Results, table: StatsTable, draft: Draft) -> None:
    from ..analysis.plots import bar, hyperparam_boxes
    for m in r.methods:
        if m in BASELINES or np.isnan(r.eta[m]).all():
            continue
        ok = ~np.isnan(r.eta[m]).any(axis=1)
        hyperparam_boxes(r.beta[m][ok], [f"bn{i}" for i in range(r.beta[m].shape[1])], f"{m}: beta per BN layer", "beta",
                         draft.path(f"beta_{m}.png"))
        hyperparam_boxes(r.eta[m][ok], table.param_names, f"{m}: learning rate per tensor", "eta",
                         draft.path(f"eta_{m}.png"), log=True)
    sp = {m: float(np.nanmean(r.sparsity[m])) for m in r.methods if m not in BASELINES and not np.isnan(r.sparsity[m]).all()}
    if sp:
        bar(sp, "share of parameters with learning rate 0", "sparsity", draft.path("sparsity.png"))


def run(cfg: PersonalizeConfig, store: Store, pretrain_ref: str | None = None, stats_ref: str | None = None,
        meta_refs: list[str] | None = None, force: bool = False, progress: Progress | None = None) -> tuple[Artifact, bool]:
    check(cfg)
    pre_art = store.load("pretrain", pretrain_ref)
    stats_art, table = stats_stage.load_matching(store, stats_ref, pre_art.id)
    metas = resolve_meta(store, cfg, meta_refs or [], pre_art.id, table)
    parents = {"partition": stats_art.parents["partition"], "pretrain": pre_art.id, "stats": stats_art.id}
    parents |= {f"meta-train:{m.name}": m.art_id for m in metas}
    _, part = partition_stage.load(store, parents["partition"])
    clients = part.pool(cfg.unseen)
    if not clients:
        raise FedL2PError(f"the {'unseen' if cfg.unseen else 'seen'} pool of partition {parents['partition']} is empty")

    def build(draft: Draft) -> None:
        r = evaluate_pool(cfg, store, pre_art.id, part, table, metas, clients, progress or NoProgress())
        results_h5.write(draft.path("results.h5"), r)
        s = summarize(r, part.domain_names)
        draft.path("summary.json").write_text(json.dumps(s, indent=2))
        draft.path("summary.md").write_text(markdown(s))
        plots(r, table, draft)
        draft.metrics = {"pool": s["pool"], "global_acc": s["global_acc"]} | {m: v["mean"] for m, v in s["methods"].items()}

    return build_or_reuse(store, "personalize", json.loads(json.dumps(cfg.__dict__)), parents, build, force)


def load(store: Store, ref: str | None) -> tuple[Artifact, results_h5.Results]:
    art = store.load("personalize", ref)
    return art, results_h5.read(art.file("results.h5"))
