"""`fedl2p personalize`: every client of a pool fine-tunes the global model under each method; test accuracy."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import torch

from .. import device, methods
from ..algorithms.fedl2p import hyper_fn
from ..algorithms.fedl2p import MetaConfig
from ..artifacts import Artifact, Draft, Store
from ..configs import PersonalizeConfig
from ..core.config import validate
from ..core.finetune import Strategy, finetune, personalized_accuracy
from ..core.functional import evaluate
from ..core import metanets
from ..core.metanets import normalize_inputs
from ..core.selection import NO_FT, select_by_validation
from ..engine.loop import generator, group_of
from ..errors import FedL2PError
from ..io import results_h5
from ..io.stats_h5 import StatsTable
from . import meta_train as meta_stage
from . import partition as partition_stage
from . import pfl as pfl_stage
from . import pretrain as pretrain_stage
from . import stats as stats_stage
from .common import NoProgress, Progress, build_or_reuse, config_dict
from .pretrain import global_accuracy



def fixed(m: str) -> bool:
    """A hand-made method: one strategy for every client (the registry's HandMade)."""
    return isinstance(methods.get(m), methods.HandMade)


@dataclass
class MetaMethod:
    name: str
    art_id: str
    lam: dict
    meta: MetaConfig
    norm: dict | None = None


def check(cfg: PersonalizeConfig) -> None:
    validate(cfg)
    if not cfg.seeds:
        raise FedL2PError("--seeds must list at least one seed")
    if len(set(cfg.methods)) != len(cfg.methods):
        raise FedL2PError("--methods lists a method twice")


def resolve_meta(store: Store, cfg: PersonalizeConfig, meta_refs: list[str], pretrain_id: str, table: StatsTable,
                 stats_id: str | None = None) -> list[MetaMethod]:
    """Meta-net artifacts by id, plus the newest artifact for any requested variant name (e.g. 'fedl2p'): one
    learned on these clients' statistics if there is one, else one of the same pretrained model."""
    arts = [store.load("meta-train", r) for r in meta_refs]
    known = {a.metrics.get("variant") for a in arts}
    for m in cfg.methods:
        if m in known or not isinstance(methods.get(m), methods.Learned) and methods.get(m) is not None:
            continue  # hand-made, another system (resolve_pfl), or named by --meta
        hit = (store.newest("meta-train", lambda a: a.metrics.get("variant") == m and a.parents.get("stats") == stats_id)
               or store.newest("meta-train", lambda a: a.metrics.get("variant") == m and a.parents.get("pretrain") == pretrain_id))
        if hit is None and arts:  # --meta named the learned rows: a variant name without an artifact (the default
            continue  # --methods' 'fedl2p' after `flower import`) is answered by them
        if hit is None:
            have = sorted({a.metrics.get("variant") for a in store.iter("meta-train") if a.parents.get("pretrain") == pretrain_id})
            hint = (f"; this model's trained variants: {', '.join(have)} (name one in --methods, or pass --meta ID)"
                    if have else "; run `fedl2p meta-train` first")
            raise FedL2PError(f"unknown method '{m}': not a hand-made method ({', '.join(methods.handmade())}), not a system "
                              f"({', '.join(methods.systems())}) and no meta-train artifact "
                              f"of that variant for pretrained model {pretrain_id}{hint}")
        arts.append(store.load("meta-train", hit.id))
    out = []
    for a in arts:
        _, lam, norm = meta_stage.load_lambda(store, a.id)
        check_shapes(a, lam, table)
        meta = MetaConfig(**a.config["meta"])
        suffix = "-tbs" if cfg.eval_stats == "test-batch" else ""  # its rows must not pass for the paper's inference
        out.append(MetaMethod(a.metrics["variant"] + suffix, a.id, lam, meta, norm))
    return out


def resolve_pfl(store: Store, cfg: PersonalizeConfig, pfl_refs: list[str], partition_id: str) -> list[pfl_stage.Trained]:
    """pfl artifacts by id, plus the newest one trained on this partition for any requested algorithm name."""
    arts = [store.load("pfl", r) for r in pfl_refs]
    for a in arts:
        if a.parents.get("partition") != partition_id:
            raise FedL2PError(f"pfl artifact {a.id} was trained on partition {a.parents.get('partition')}, not {partition_id}")
    known = {a.config["algo"] for a in arts}
    for m in cfg.methods:
        if isinstance(methods.get(m), methods.System) and m not in known:
            hit = store.newest("pfl", lambda a: a.config.get("algo") == m and a.parents.get("partition") == partition_id)
            if hit is None:
                raise FedL2PError(f"method '{m}' has no pfl artifact for partition {partition_id}; run `fedl2p pfl-train --algo {m}` first")
            arts.append(hit)
    return [pfl_stage.load(store, a.id) for a in arts]


def check_shapes(art: Artifact, lam: dict, t: StatsTable) -> None:
    want = metanets.shapes(t.xi.shape[1], t.x.shape[1], len(t.param_names))  # what this model's meta-nets must be
    for k, v in lam.items():
        key = k.split(".", 1)[1] if k.startswith("client") else k
        if key in want and tuple(v.shape) != want[key]:
            raise FedL2PError(f"meta-nets {art.id} were trained for another model shape ({key} is {tuple(v.shape)}, "
                              f"this model needs {want[key]})")


def strategies(cfg: PersonalizeConfig, metas: list[MetaMethod], c: int, table: StatsTable, n_bn: int,
               n_p: int, model: torch.nn.Module | None = None) -> dict[str, Strategy | None]:
    """The fixed strategy of every method but ft-tuned (which picks its own per client and seed)."""
    out: dict[str, Strategy | None] = {m: fixed_strategy(m, 1.0, cfg.base_lr, n_bn, n_p, model)
                                       for m in cfg.methods if fixed(m)}
    pool = "unseen" if cfg.unseen else "seen"
    for mm in metas:
        if not methods.get(mm.name).supports(pool):  # e.g. L2P: a lambda per client it trained, none for others
            out[mm.name] = None
            continue
        xi, x = normalize_inputs(mm.norm, *table.inputs(c))
        lam = mm.lam
        if any(k.startswith("client") for k in lam):  # L2P: per-client lambda; none for clients it never saw
            lam = group_of(lam, f"client{c}")
            if not lam:
                out[mm.name] = None
                continue
        with torch.no_grad():
            beta, eta = hyper_fn(xi, x, n_p, mm.meta)(lam)
        out[mm.name] = Strategy(beta, eta)
    return out


def fixed_strategy(name: str, factor: float, base_lr: float, n_bn: int, n_p: int,
                   model: torch.nn.Module | None = None) -> Strategy:
    """A hand-made method's strategy (the registry's beta) at `factor` x its LR; LR 0 for the parameter tensors of
    `model` its `tensors` leaves out."""
    m = methods.get(name)
    lr = torch.full((n_p,), base_lr * m.lr_factor * factor)
    if m.tensors is not None:
        chosen = set(m.tensors(model))
        lr *= torch.tensor([n in chosen for n, _ in model.named_parameters()], dtype=lr.dtype)
    return Strategy(None if m.beta is None else torch.full((n_bn,), float(m.beta)), lr)


def tune_client(cfg: PersonalizeConfig, model, theta_g, data, bn0, gen_for, n_bn: int, n_p: int,
                grid: list[tuple[str, float]]) -> np.ndarray:
    """Every candidate's (validation loss, validation accuracy, test accuracy) for one client and seed, in `grid`'s
    order ((hand-made method, LR factor) or no fine-tuning). Rows are [val_loss, val_acc, test_acc]."""
    out = np.zeros((len(grid), 3))
    for i, (name, f) in enumerate(grid):
        if name == NO_FT:
            vl, va = evaluate(model, theta_g, *data.val)
            out[i] = vl, va, evaluate(model, theta_g, *data.test)[1]
            continue
        s = device.move(fixed_strategy(name, f, cfg.base_lr, n_bn, n_p, model), data.train[0].device)
        ft = finetune(model, theta_g, *data.train, s, bn0, cfg.epochs, cfg.batch_size, gen_for(), cfg.client_bn)
        vl, va = personalized_accuracy(model, ft.params, *data.val, s, ft.bn, cfg.batch_size)
        out[i] = vl, va, personalized_accuracy(model, ft.params, *data.test, s, ft.bn, cfg.batch_size)[1]
    return out


def evaluate_pool(cfg: PersonalizeConfig, store: Store, pre_id: str, part, table: StatsTable, metas: list[MetaMethod],
                  clients: list[int], progress: Progress, pfls: list[pfl_stage.Trained] = ()) -> results_h5.Results:
    dev = device.current()
    _, model, state = pretrain_stage.load(store, pre_id)
    model.to(dev).eval()
    theta_g = device.move({n: state[n] for n, _ in model.named_parameters()}, dev)
    pfls = [pfl_stage.to_device(t, dev) for t in pfls]
    n_bn, n_p = table.xi.shape[1], len(theta_g)
    tuned = next((m for m in cfg.methods if isinstance(methods.get(m), methods.Tuned)), None)
    grid = methods.get(tuned).candidates() if tuned else []  # hand-made rows at x1 LR come from its grid (same batches)
    handmade = methods.handmade()
    names = list(dict.fromkeys([m for m in cfg.methods if m in handmade] + [mm.name for mm in metas] + [t.algo for t in pfls]))
    acc = np.full((len(names), len(cfg.seeds), len(clients)), np.nan)
    cand = np.full((len(cfg.seeds), len(clients), len(grid), 3), np.nan) if tuned else None
    beta = {m: np.full((len(clients), n_bn), np.nan, dtype=np.float32) for m in names}
    eta = {m: np.full((len(clients), n_p), np.nan, dtype=np.float32) for m in names}
    sparsity = {m: np.full(len(clients), np.nan) for m in names}
    before = np.zeros(len(clients))
    sizes = torch.tensor([v.numel() for v in theta_g.values()], dtype=torch.float64)
    progress.start(f"personalize ({'unseen' if cfg.unseen else 'seen'} clients)", len(clients) * len(cfg.seeds))
    for j, c in enumerate(clients):
        data, bn0 = part.client_on(c, dev), device.move(table.client_bn(c), dev)
        before[j] = global_accuracy(model, state, *data.test)
        model.eval()
        strat = strategies(cfg, metas, c, table, n_bn, n_p, model)  # on the CPU, where they are recorded
        for i, m in enumerate(names):
            s = strat.get(m)
            if s is None:
                continue
            beta[m][j] = np.nan if s.beta is None else s.beta.numpy()
            eta[m][j] = s.lr.numpy()
            sparsity[m][j] = float((sizes * (s.lr == 0)).sum() / sizes.sum())
        strat = device.move(strat, dev)
        for k, seed in enumerate(cfg.seeds):
            gen_for = lambda: generator(seed, c, 7)  # noqa: E731  the same batch order for every method: paired
            if tuned:  # its grid contains the FT baselines at the base LR (same batches): their rows come from it
                cand[k, j] = tune_client(cfg, model, theta_g, data, bn0, gen_for, n_bn, n_p, grid)
                pick = select_by_validation(cand[k, j, :, 1], cand[k, j, :, 0])
                acc[names.index(tuned), k, j] = cand[k, j, pick, 2]
                for m in names:
                    if (m, 1.0) in grid:
                        acc[names.index(m), k, j] = cand[k, j, grid.index((m, 1.0)), 2]
            for t in pfls:  # the other personalised-FL systems: their own models, the same clients and seeds
                acc[names.index(t.algo), k, j] = pfl_stage.client_accuracy(t, c, data, seed, cfg.pfl_steps)
            for i, m in enumerate(names):
                s = strat.get(m)
                if s is None or (tuned and (m, 1.0) in grid):
                    continue
                ft = finetune(model, theta_g, *data.train, s, bn0, cfg.epochs, cfg.batch_size, gen_for(), cfg.client_bn)
                acc[i, k, j] = personalized_accuracy(model, ft.params, *data.test, s, ft.bn, cfg.batch_size,
                                                     "running" if m in handmade else cfg.eval_stats)[1]
            progress.advance(1)
    progress.stop()
    return results_h5.Results(names, list(cfg.seeds), "unseen" if cfg.unseen else "seen", np.array(clients),
                              part.domain[clients], before, acc, beta, eta, sparsity,
                              {"epochs": cfg.epochs, "base_lr": cfg.base_lr, "client_bn": cfg.client_bn,
                               "eval_stats": cfg.eval_stats}, cand)


def summarize(r: results_h5.Results, domain_names: list[str]) -> dict:
    """Paper layout: per method, mean over clients, then mean and SD over seeds; also per domain."""
    rows = {}
    for i, m in enumerate(r.methods):
        per_seed = np.nanmean(r.acc_after[i], axis=1) if not np.isnan(r.acc_after[i]).all() else np.full(len(r.seeds), np.nan)
        learned = not fixed(m) and not np.isnan(r.sparsity[m]).all()
        rows[m] = {"mean": float(np.mean(per_seed)), "sd": float(np.std(per_seed)),
                   "sparsity": float(np.nanmean(r.sparsity[m])) if learned else None,
                   "per_domain": {domain_names[d]: float(np.nanmean(r.acc_after[i][:, r.domain == d]))
                                  for d in np.unique(r.domain) if not np.isnan(r.acc_after[i][:, r.domain == d]).all()}}
    for m in r.methods:
        if not fixed(m) and not np.isnan(r.beta[m]).all():
            rows[m]["beta_per_domain"] = {domain_names[d]: [float(v) for v in np.nanmean(r.beta[m][r.domain == d], axis=0)]
                                          for d in np.unique(r.domain)}
    base = [m for m in r.methods if m in methods.baselines()]
    out = {"pool": r.pool, "clients": len(r.client), "seeds": r.seeds, "global_acc": float(r.acc_before.mean()), "methods": rows}
    if base:
        best = max(base, key=lambda m: rows[m]["mean"])
        out["best_baseline"] = best
        bi = r.methods.index(best)
        for i, m in enumerate(r.methods):
            if m not in base and not np.isnan(r.acc_after[i]).all():
                diff = np.nanmean(r.acc_after[i] - r.acc_after[bi], axis=0)  # per client, over seeds
                rows[m]["vs_best_baseline"] = float(np.nanmean(diff))
                rows[m]["clients_better"] = float(np.mean(diff[~np.isnan(diff)] > 0))
    tuned = next((m for m in r.methods if isinstance(methods.get(m), methods.Tuned)), None)
    if tuned is not None:
        ti = r.methods.index(tuned)
        for i, m in enumerate(r.methods):
            if m not in methods.handmade() and not np.isnan(r.acc_after[i]).all():
                rows[m]["vs_ft_tuned"] = float(np.nanmean(r.acc_after[i] - r.acc_after[ti]))
    return out


def markdown(s: dict) -> str:
    lines = [f"Personalised test accuracy, {s['pool']} clients ({s['clients']}), mean ± SD over seeds {s['seeds']}", "",
             "| method | accuracy (%) | Δ vs best FT | Δ vs FT tuned | clients better | sparsity |", "|---|---|---|---|---|---|",
             f"| global model | {100 * s['global_acc']:.2f} | | | | |"]
    for m, v in s["methods"].items():
        lines.append("| " + " | ".join(row_cells(m, v)) + " |")
    for m, v in s["methods"].items():
        if "beta_per_domain" in v:
            title, cols, rows = beta_table(m, v["beta_per_domain"])
            lines += ["", f"{title} (mean over a domain's clients)", "",
                      "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def beta_table(m: str, per_domain: dict[str, list[float]]) -> tuple[str, list[str], list[list[str]]]:
    """Title, columns and rows of a learned method's β by domain (rows) and BN layer (columns): what an ARI alone
    hides, how far apart the domains' β are."""
    n = len(next(iter(per_domain.values())))
    return (f"β per domain and BN layer, {methods.label(m)}",
            ["domain"] + [f"bn{i}" for i in range(n)], [[d] + [f"{b:.2f}" for b in bs] for d, bs in per_domain.items()])


def row_cells(m: str, v: dict) -> list[str]:
    """One summary row: label, mean ± SD, Δ vs best FT, Δ vs ft-tuned, share of clients better, sparsity."""
    fmt = lambda k: f"{100 * v[k]:+.2f}" if k in v else ""  # noqa: E731
    if np.isnan(v["mean"]):  # e.g. pFedLA on unseen clients: it has no model for them
        return [methods.label(m), "N/A", "", "", "", ""]
    return [methods.label(m), f"{100 * v['mean']:.2f} ± {100 * v['sd']:.2f}", fmt("vs_best_baseline"), fmt("vs_ft_tuned"),
            f"{100 * v['clients_better']:.0f}%" if "clients_better" in v else "",
            f"{v['sparsity']:.3f}" if v.get("sparsity") is not None else ""]


def plots(r: results_h5.Results, table: StatsTable, draft: Draft) -> None:
    from ..analysis.plots import bar, hyperparam_boxes
    for m in r.methods:
        if fixed(m) or np.isnan(r.eta[m]).all():
            continue
        ok = ~np.isnan(r.eta[m]).any(axis=1)
        hyperparam_boxes(r.beta[m][ok], [f"bn{i}" for i in range(r.beta[m].shape[1])], f"{m}: beta per BN layer", "beta",
                         draft.path(f"beta_{m}.png"))
        hyperparam_boxes(r.eta[m][ok], table.param_names, f"{m}: learning rate per tensor", "eta",
                         draft.path(f"eta_{m}.png"), log=True)
    sp = {m: float(np.nanmean(r.sparsity[m])) for m in r.methods if not fixed(m) and not np.isnan(r.sparsity[m]).all()}
    if sp:
        bar(sp, "share of parameters with learning rate 0", "sparsity", draft.path("sparsity.png"))


def run(cfg: PersonalizeConfig, store: Store, pretrain_ref: str | None = None, stats_ref: str | None = None,
        meta_refs: list[str] | None = None, force: bool = False, progress: Progress | None = None,
        pfl_refs: list[str] | None = None) -> tuple[Artifact, bool]:
    check(cfg)
    if pretrain_ref is None and stats_ref is not None:  # the statistics name their model
        pretrain_ref = store.load("stats", stats_ref, verify=False).parents["pretrain"]
    pre_art = store.load("pretrain", pretrain_ref)
    stats_art, table = stats_stage.load_matching(store, stats_ref, pre_art.id)
    metas = resolve_meta(store, cfg, meta_refs or [], pre_art.id, table, stats_art.id)
    parents = {"partition": stats_art.parents["partition"], "pretrain": pre_art.id, "stats": stats_art.id}
    parents |= {f"meta-train:{m.name}": m.art_id for m in metas}
    pfls = resolve_pfl(store, cfg, pfl_refs or [], parents["partition"])
    parents |= {f"pfl:{t.algo}": t.art_id for t in pfls}
    _, part = partition_stage.load(store, parents["partition"])
    clients = part.pool(cfg.unseen)
    if not clients:
        raise FedL2PError(f"the {'unseen' if cfg.unseen else 'seen'} pool of partition {parents['partition']} is empty")

    def build(draft: Draft) -> None:
        r = evaluate_pool(cfg, store, pre_art.id, part, table, metas, clients, progress or NoProgress(), pfls)
        results_h5.write(draft.path("results.h5"), r)
        s = summarize(r, part.domain_names)
        draft.path("summary.json").write_text(json.dumps(s, indent=2))
        draft.path("summary.md").write_text(markdown(s))
        plots(r, table, draft)
        draft.metrics = {"pool": s["pool"], "global_acc": s["global_acc"]} | {m: v["mean"] for m, v in s["methods"].items()}

    return build_or_reuse(store, "personalize", config_dict(cfg), parents, build, force)


def load(store: Store, ref: str | None) -> tuple[Artifact, results_h5.Results]:
    art = store.load("personalize", ref)
    return art, results_h5.read(art.file("results.h5"))
