"""`make bench-accuracy`: the paper's regimes on embedded data, one report in the layout of Tables 2-4.

Cells (each: meta-train on the seen pool, personalise seen and unseen pools, 3 seeds, e = 5):
- label shift (Table 2 analogue): clean Fashion-MNIST at alpha in {1000, 1.0, 0.5, 0.1}; FedAvg pretraining on the
  same clients, reported next to the same model trained centrally on the same images;
- feature shift from unseen domains (Table 3 analogue): the alpha = 1000 clean model personalised to clients holding
  corrupted images it never saw (clean + 6 generated corruptions, severity 3), each type split by Dir(alpha),
  alpha in {1000, 0.1};
- unseen clients (Table 4 analogue): every cell's unseen pool, with meta-nets learned on the seen pool;
- the planted-signal cell (issue 26) and the speakers of the embedded spoken-commands set.

Each cell is declared by its shipped pipeline files, bench/CELL and its extra groups bench/CELL.GROUP
(pipelines/bench/): `fedl2p run bench/CELL` builds (or reuses) the same artifacts this script does.
Every stage is an artifact, so a killed run resumes where it stopped: `python bench/accuracy.py [CELL ...]`
runs the named cells (default: all, most important first) in `--jobs` processes of one torch thread each, then writes
bench/accuracy.md and bench/accuracy.json from whatever cells are complete. The oracle row picks, per client, the
ft-tuned candidate with the best *test* accuracy: an upper bound on any per-client choice among those recipes, never
a method.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np

from fedl2p_cli.analysis import tables

HERE = Path(__file__).resolve().parent
STORE = Path(os.environ.get("FEDL2P_STORE", HERE.parent / "artifacts"))
SEEDS = [0, 1, 2]          # personalisation seeds (batch order of every method's fine-tuning), inside each meta-train seed
META_SEEDS = [0, 1, 2]     # meta-train seeds (meta-net init, client sampling, batches): every learned row's spread
EPOCHS = 5
BASE_LR = 0.01

BENCH = HERE.parent / "pipelines" / "bench"
# The cells, each declared by its pipeline files (bench/CELL.toml and its extra groups CELL.GROUP.toml there):
# what `fedl2p run` runs, once. Kind (how the report reads it) and alpha (its label in the tables):
CELLS = {"fs-1000": ("feature", 1000.0), "fs-0.1": ("feature", 0.1), "ls-1000": ("label", 1000.0),
         "ls-0.1": ("label", 0.1), "ls-1": ("label", 1.0), "ls-0.5": ("label", 0.5), "planted": ("planted", 0.05),
         "speech": ("speech", float("nan"))}
SHIFTED = ("feature", "planted")  # cells personalising the clean model to clients it never saw
# a cell's extra groups, in the order they run: named options its measurements called for (extras), FOMAML+ with
# --beta-init 0.9 (binit, every cell) and, on feature-shift cells, the other personalised-FL systems (pfl). Each
# personalises the hand-made baselines with it: its rows join the cell's table (same clients, seeds and batches).
GROUPS = ("extras", "binit", "pfl")


def handed(**fields):
    """A Runtime carrying this process's catalog: what a bench script, its own entry point, hands the runs it starts."""
    from fedl2p_cli import plugins
    from fedl2p_cli.runtime import Runtime
    return Runtime(catalog=plugins.current(), **fields)


def pipeline_file(cell: str, group: str | None = None) -> Path:
    return BENCH / (f"{cell}.{group}.toml" if group else f"{cell}.toml")


def sections(cell: str, full: bool = True, group: str | None = None, stable_ift: bool = False) -> dict:
    """The sections of a cell's pipeline file (without its learning and personalisation when not `full`; with only its
    stable-IFT meta-train runs, variant `fedl2p` at any seed, when `stable_ift`). Meta-train workers (not part of any
    id) follow the process: 2, or 1 inside the cells' pool (a daemon may not start processes)."""
    from fedl2p_cli.stages.pipeline_files import resolve
    s = resolve(pipeline_file(cell, group))  # its extends chain applied
    s = {k: v for k, v in s.items() if k not in ("name", "description")}
    if not full:
        return {k: v for k, v in s.items() if k not in ("meta-train", "pfl", "personalize")}
    workers = 1 if mp.current_process().daemon else 2
    s["meta-train"] = [m | {"workers": workers} for m in s.get("meta-train", []) if not stable_ift or _stable_ift_table(m)]
    return s


def prerequisites(cell: str) -> dict[str, str]:
    """Build (or reuse) the cell's partition, pretrained model and statistics; their artifact ids by stage. Scripts
    that run variants in parallel processes call this first: otherwise every process would try to build them at once,
    and all but one would stop at the build lock."""
    import torch
    torch.set_num_threads(1)
    from fedl2p_cli.cli.render import RichProgress
    from fedl2p_cli.stages import pipeline
    res = pipeline.run(pipeline.Pipeline(f"prerequisites-{cell}", sections(cell, full=False), pipeline.Store(STORE)),
                       None, RichProgress, runtime=handed())
    return {r.stage: r.artifact.id for r in res}


def run_extras(cell: str, cell_extras: bool = True) -> None:
    """A finished cell's extra groups (GROUPS; `extras` only if cell_extras), each its own pipeline file."""
    for group in GROUPS:
        if pipeline_file(cell, group).is_file() and (cell_extras or group != "extras"):
            _run(f"{cell} ({group})", sections(cell, group=group))


def _run(label: str, secs: dict) -> None:
    import torch
    torch.set_num_threads(1)
    from fedl2p_cli.cli.render import RichProgress
    from fedl2p_cli.stages import pipeline
    t0 = time.time()
    try:
        pipeline.run(pipeline.Pipeline(f"accuracy-{label}", secs, pipeline.Store(STORE)), None, RichProgress, runtime=handed())
    except Exception as e:  # one failed cell must not hide the others; say which and why, at once
        print(f"[{label}] FAILED: {e.__class__.__name__}: {e}", flush=True)
        return
    print(f"[{label}] done in {time.time() - t0:.0f} s", flush=True)


def run_cell(cell: str, full: bool = True, stable_ift: bool = False) -> None:
    _run(cell, sections(cell, full, stable_ift=stable_ift))
    if full and not stable_ift:
        run_extras(cell)


def central_accuracy(part_id: str, pretrain_cfg: dict, epochs: int = 10) -> float:
    """The same model trained centrally on the seen clients' pooled train images (SGD, batch 32, the pretraining
    LR with x0.1 at 50% and 75% of the epochs), tested on the seen clients' pooled test images."""
    import torch
    import torch.nn.functional as F

    from fedl2p_cli import plugins
    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.core.functional import get_state
    from fedl2p_cli.engine.loop import generator, step_lr
    from fedl2p_cli.models import registry
    from fedl2p_cli.stages import partition as partition_stage
    from fedl2p_cli.stages.pretrain import global_accuracy, pool_tensors
    torch.set_num_threads(1)
    _, part = partition_stage.load(Store(STORE), part_id)
    seen = part.pool(False)
    x, y = pool_tensors(part, seen, "train")
    model = registry.build(pretrain_cfg["model"], part.in_channels, part.num_classes, pretrain_cfg["seed"],
                           catalog=plugins.current()).train()
    opt = torch.optim.SGD(model.parameters(), lr=pretrain_cfg["lr"])
    gen = generator(pretrain_cfg["seed"], 0, 0)
    for ep in range(epochs):
        for g in opt.param_groups:
            g["lr"] = step_lr(pretrain_cfg["lr"], ep, epochs)
        for idx in torch.randperm(len(y), generator=gen).split(32):
            if len(idx) < 2:
                continue
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return global_accuracy(model, get_state(model), *pool_tensors(part, seen, "test"))


def oracle(candidates: np.ndarray) -> tuple[float, float]:
    """[S, C, K, 3] -> mean and SD over seeds of the clients' mean best *test* accuracy over the candidates."""
    per_seed = candidates[..., 2].max(axis=2).mean(axis=1)
    return float(per_seed.mean()), float(per_seed.std())


def planned(cell: str, group: str | None = None, stable_ift: bool = False) -> list | None:
    """The artifacts of a cell's pipeline file (or of one of its groups), found as `fedl2p run` and `fedl2p report`
    find them: its compiled plan executed with reuse_only (nothing is built). None while one of them is missing."""
    from fedl2p_cli.stages import pipeline
    from fedl2p_cli.stages.common import Missing, NoProgress
    p = pipeline.Pipeline(f"accuracy-{cell}", sections(cell, group=group, stable_ift=stable_ift), pipeline.Store(STORE))
    try:
        return pipeline.run(p, None, NoProgress, runtime=handed(reuse_only=True))
    except Missing:
        return None


def collect(cell: str, stable_ift: bool = False) -> list[dict] | None:
    """The finished cell's rows (one per pool), or None if it is not complete (`stable_ift`: of its stable-IFT run).
    Its extra groups' learned rows join them (not with `stable_ift`: that report is the stable IFT's alone)."""
    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.stages import personalize as pers_stage
    store = Store(STORE)
    main = planned(cell, stable_ift=stable_ift)
    if main is None:
        return None
    groups = [] if stable_ift else [g for g in GROUPS if pipeline_file(cell, g).is_file()]
    extras = [r.artifact for g in groups for r in planned(cell, g) or [] if r.stage == "personalize"]
    rows = []
    for art in (r.artifact for r in main if r.stage == "personalize"):
        _, r = pers_stage.load(store, art.id)
        s = json.loads(art.file("summary.json").read_text())
        merge_extras(store, art, r, s, extras)
        row = {"cell": cell, "kind": CELLS[cell][0], "alpha": CELLS[cell][1], "pool": s["pool"], "clients": s["clients"],
               "global": s["global_acc"], "methods": s["methods"], "best_baseline": s.get("best_baseline"),
               "personalize": art.id, "pretrain": art.parents["pretrain"], "base_lr": art.config.get("base_lr", BASE_LR)}
        if r.candidates is not None:
            row["oracle"] = oracle(r.candidates)
        pre = store.load("pretrain", art.parents["pretrain"], verify=False)
        row["pretrain_seen_acc"] = pre.metrics.get("seen_acc")
        row["pretrain_partition"] = pre.parents["partition"]
        rows.append(row)
    pools = {r["pool"] for r in rows}
    return rows if {"seen", "unseen"} <= pools else None


def merge_extras(store, main, r, s: dict, arts: list) -> None:
    """Learned methods evaluated by another personalize artifact on the same clients, seeds and batches (same
    pretrained model, stats, pool, epochs, LR and client statistics) join the main table, with their paired deltas."""
    from fedl2p_cli.stages import personalize as pers_stage
    same = ("unseen", "epochs", "batch_size", "base_lr", "client_bn")
    for a in arts:
        if a.id == main.id or a.parents["stats"] != main.parents["stats"] or any(a.config.get(k) != main.config.get(k) for k in same):
            continue
        _, x = pers_stage.load(store, a.id)
        if np.array_equal(x.client, r.client):
            join(r, s, x, json.loads(a.file("summary.json").read_text()))


def join(r, s: dict, x, xs: dict) -> None:
    """Into the main personalisation's summary `s` (results `r`), the learned rows of another one on the same clients
    (results `x`, summary `xs`), their deltas paired against the main one's best baseline and tuned row as
    `fedl2p personalize` pairs them (personalize.deltas): the extra groups personalise no tuned row of their own."""
    from fedl2p_cli import methods as registry
    from fedl2p_cli import plugins
    from fedl2p_cli.stages import personalize as pers_stage
    best, tuned = pers_stage.references(r, s.get("best_baseline"), plugins.current())
    for i, m in enumerate(x.methods):
        if m in registry.handmade(plugins.current()) or m in s["methods"] or np.isnan(x.acc_after[i]).all():
            continue
        s["methods"][m] = xs["methods"][m] | pers_stage.deltas(x.acc_after[i], best, tuned)


def cluster_rows(cell: str, row: dict) -> dict:
    """ARI of xi and of each learned variant's beta vs the true domains (seen pool), over every personalisation of
    these clients (the extras' too). A beta that is the same for every client (spread < 1e-3 in every layer) has no
    clusters: spectral clustering of rounding noise gave ARIs from 0.36 to 0.69 here, so it is reported as constant."""
    from fedl2p_cli import methods as registry
    from fedl2p_cli import plugins
    from fedl2p_cli.analysis.clusters import spectral_ari
    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.stages import personalize as pers_stage
    from fedl2p_cli.stages import stats as stats_stage
    store = Store(STORE)
    main, r = pers_stage.load(store, row["personalize"])
    _, table = stats_stage.load(store, main.parents["stats"])
    idx = [table.row(int(c)) for c in r.client]
    out: dict = {"xi": spectral_ari(table.xi.numpy()[idx].astype(np.float64), r.domain)[0]}
    for art in store.iter("personalize"):
        if art.parents.get("stats") != main.parents["stats"] or art.config.get("unseen") != main.config.get("unseen"):
            continue
        _, x = pers_stage.load(store, art.id)
        if not np.array_equal(x.client, r.client):
            continue
        for m in x.methods:
            if m in registry.handmade(plugins.current()) or f"beta ({m})" in out or np.isnan(x.beta[m]).any():
                continue
            spread = float(np.ptp(x.beta[m], axis=0).max())
            out[f"beta ({m})"] = spectral_ari(x.beta[m].astype(np.float64), r.domain)[0] if spread >= 1e-3 else "constant"
    return out


SWEEP = (0.0, 0.25, 0.5, 0.75, 1.0)
SWEEP_LRS = (BASE_LR, BASE_LR / 10)  # at the base LR, beta = 0 (no batch statistics in training) is unstable


def cell_harness(ids: dict[str, str]):
    """The personalisation harness (stages/harness.py, on the CPU) of a cell's artifacts, by stage: e epochs, batch 32."""
    import torch

    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.stages import partition as partition_stage
    from fedl2p_cli.stages import pretrain as pretrain_stage
    from fedl2p_cli.stages import stats as stats_stage
    from fedl2p_cli.stages.harness import Harness
    store = Store(STORE)
    _, model, state = pretrain_stage.load(store, ids["pretrain"])
    _, table = stats_stage.load(store, ids["stats"])
    _, part = partition_stage.load(store, ids["partition"])
    return Harness.on(torch.device("cpu"), model, state, part, table, EPOCHS, 32)


def beta_sweep(personalize_id: str, seed: int = 0) -> dict[str, dict[str, list[float]]]:
    """What beta the data asks for: per domain and learning rate, the mean test accuracy of fine-tuning every seen
    client with one fixed beta for all BN layers (PreciseBN statistics, the personalisation's batches)."""
    import torch

    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.core.finetune import Strategy
    torch.set_num_threads(1)
    h = cell_harness(Store(STORE).load("personalize", personalize_id).parents)
    part = h.part
    acc: dict[str, list[list[float]]] = {}
    for c in part.pool(False):
        client = h.client(c)
        row = []
        for lr in SWEEP_LRS:
            for b in SWEEP:
                s = Strategy(torch.full((h.n_bn,), b), torch.full((h.n_params,), lr))
                row.append(h.finetune(client, s, seed).evaluate("test")[1])
        acc.setdefault(part.domain_names[part.domain[c]], []).append(row)
    n = len(SWEEP)
    return {d: {f"{lr:g}": [float(v) for v in np.mean(rows, axis=0)[i * n:(i + 1) * n]] for i, lr in enumerate(SWEEP_LRS)}
            for d, rows in acc.items()}


def stats_comparison(row: dict) -> dict[str, dict[str, float]]:
    """The same cell personalised with the paper's running client statistics (`client_bn = "running"`) next to the
    default recomputed ones: FT baselines and the meta-net variants, same clients, seeds and batches."""
    from fedl2p_cli import methods as registry
    from fedl2p_cli import plugins
    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.cli import options
    from fedl2p_cli.stages import personalize as pers_stage
    store = Store(STORE)
    main = store.load("personalize", row["personalize"], verify=False)
    metas = [v for k, v in main.parents.items() if k.startswith("meta-train:")]
    out = {"precise": {m: v["mean"] for m, v in row["methods"].items() if m != "ft-tuned"}}
    cfg = pers_stage.PersonalizeConfig(unseen=row["pool"] == "unseen", methods=list(registry.baselines(plugins.current())), epochs=EPOCHS,
                                       batch_size=32, base_lr=BASE_LR, seeds=SEEDS, client_bn="running")
    art, _ = options.execute(pers_stage, cfg, {"pretrain": main.parents["pretrain"], "stats": main.parents["stats"], "meta": metas},
                             store.root, handed(), False)
    out["running"] = {m: v["mean"] for m, v in json.loads(art.file("summary.json").read_text())["methods"].items()}
    return out


def _stable_ift_table(table: dict) -> bool:
    """A pipeline file's [[meta-train]] table that is the stable IFT (variant `fedl2p`, at any seed)."""
    from fedl2p_cli.configs import MetaTrainConfig
    from fedl2p_cli.core.config import from_flat
    values = {k: v for k, v in table.items() if k != "workers"}
    name = values.pop("preset", None)  # a named set of the table's keys, its own keys over it
    return _stable_ift(MetaTrainConfig.preset(name, **values) if name else from_flat(MetaTrainConfig, values))


def is_stable_ift(config: dict) -> bool:
    """A meta-train artifact's config (by its options, not its name): the IFT at every option's reference value
    (variant `fedl2p`: the paper's meta-gradient and beta init with the IFT's stabilising defaults), at any seed."""
    from fedl2p_cli.stages.meta_train import config_from_dict
    return _stable_ift(config_from_dict(config))


def _stable_ift(cfg) -> bool:
    return dataclasses.replace(cfg, seed=0).variant() == "fedl2p"


def seed_groups(store) -> dict[str, str]:
    """Each meta-train variant's name -> the name its seeds share (the same options at seed 0), from the configs."""
    from dataclasses import replace

    from fedl2p_cli.stages.meta_train import config_from_dict
    out = {}
    for art in store.iter("meta-train"):
        cfg = config_from_dict(art.config)
        out[cfg.variant()] = replace(cfg, seed=0).variant()
    return out


@functools.cache
def _store_seed_groups(store: str) -> dict[str, str]:  # one scan per report, not one per row
    from fedl2p_cli.artifacts import Store
    return seed_groups(Store(Path(store)))


def over_meta_seeds(methods: dict, groups: dict[str, str] | None = None) -> dict:
    """Learned rows of one pool merged over their meta-train seeds (`groups`: variant -> its seed-0 name; default:
    from the store's meta-train configs): mean and SD over the meta-train seeds of each seed's mean over
    personalisation seeds; `pers_sd` is the mean personalisation-seed SD. Hand-made rows (no meta-train seed) are
    kept as they are."""
    if groups is None:
        groups = _store_seed_groups(str(STORE))
    merged_by: dict[str, list[dict]] = {}
    for m, v in methods.items():
        merged_by.setdefault(groups.get(m, m), []).append(v)
    out = {}
    for m, vs in merged_by.items():
        if len(vs) == 1 and m.startswith("ft-"):
            out[m] = vs[0]
            continue
        means = np.array([v["mean"] for v in vs])
        merged = {"mean": float(np.mean(means)), "sd": float(np.std(means)), "pers_sd": float(np.mean([v["sd"] for v in vs])),
                  "meta_seeds": len(vs), "per_meta_seed": means.tolist()}
        for k in ("vs_best_baseline", "vs_ft_tuned", "clients_better"):
            if all(k in v for v in vs):
                merged[k] = float(np.mean([v[k] for v in vs]))
                merged[k + "_sd"] = float(np.std([v[k] for v in vs]))
        if all("beta_per_domain" in v for v in vs):
            merged["beta_per_domain"] = {d: np.mean([v["beta_per_domain"][d] for v in vs], axis=0).tolist()
                                         for d in vs[0]["beta_per_domain"]}
        out[m] = merged
    return out


def report(done: list[list[dict]]) -> str:
    from fedl2p_cli import methods as registry
    from fedl2p_cli import plugins
    rows = [r | {"methods": over_meta_seeds(r["methods"])} for cell in done for r in cell]
    methods = list(dict.fromkeys(m for r in rows for m in r["methods"]))
    hand = [m for m in methods if m in registry.handmade(plugins.current())]
    learned = [m for m in methods if m not in hand]
    catalog = plugins.current()
    cols = ["scenario", "α", "pool", "global", *(registry.label(m, catalog) for m in hand), "oracle (test, bound)",
            *(registry.label(m, catalog) for m in learned)]
    import subprocess
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "fedl2p_cli", "bench"], capture_output=True, text=True,
                           cwd=HERE).stdout.strip()
    stamp = f"Report written {time.strftime('%Y-%m-%d %H:%M %Z')} from commit {commit or 'unknown'}" + \
        (" (with uncommitted changes)" if dirty else "") + "; each row's artifacts were built by the code of their own day."
    lines = [stamp, "", f"Personalised test accuracy (%), e = {EPOCHS}, base LR {BASE_LR} unless the scenario names another, small CNN, "
             "2-core CPU. Hand-made rows: mean ± SD "
             f"over personalisation seeds {SEEDS}. Learned rows: mean ± SD over meta-train seeds {META_SEEDS} (each the mean "
             f"over the personalisation seeds), [the mean personalisation-seed SD], (Δ vs best of FT BN C/G/I; Δ vs FT "
             "tuned, paired, mean over meta-train seeds).", ""]
    return "\n".join(lines + tables.lines(cols, (table_row(r, hand, learned) for r in rows))) + "\n"


def table_row(r: dict, hand: list[str], learned: list[str]) -> list[str]:
    """One pool of one cell in the main table: hand-made means, the oracle, learned rows with their paired deltas."""
    ms = r["methods"]
    cells = [f"{100 * ms[m]['mean']:.2f} ± {100 * ms[m]['sd']:.2f}" if m in ms else "–" for m in hand]
    orc = f"{100 * r['oracle'][0]:.2f} ± {100 * r['oracle'][1]:.2f}" if "oracle" in r else "–"
    lrn = []
    for m in learned:
        if m not in ms or np.isnan(ms[m]["mean"]):
            # on the unseen pool a learned row without a value has no model for those clients (L2P)
            lrn.append("N/A" if r["pool"] == "unseen" and m in ms else "–")
            continue
        v = ms[m]
        pers = f" [{100 * v['pers_sd']:.2f}]" if "pers_sd" in v else ""
        lrn.append(f"{100 * v['mean']:.2f} ± {100 * v['sd']:.2f}{pers} ({100 * v.get('vs_best_baseline', np.nan):+.2f}; "
                   f"{100 * v.get('vs_ft_tuned', np.nan):+.2f})")
    scenario, alpha = ("speakers (synthetic)", "–") if r["kind"] == "speech" else (f"{r['kind']} shift", f"{r['alpha']:g}")
    if r.get("base_lr", BASE_LR) != BASE_LR:  # a cell whose own pipeline file sets another base LR (planted)
        scenario += f" (base LR {r['base_lr']:g})"
    return [scenario, alpha, r["pool"], f"{100 * r['global']:.2f}", *cells, orc, *lrn]


def beta_report(done: list[list[dict]]) -> str:
    lines = []
    for cell in done:
        for r in cell:
            if r["kind"] == "speech":  # does FedL2P mix pretrained and own statistics (paper, App. F)? both pools
                lines += speech_beta(r)
            if r["kind"] not in SHIFTED or r["pool"] != "seen":
                continue
            for m, v in over_meta_seeds(r["methods"]).items():
                if "beta_per_domain" not in v:
                    continue
                lines += [f"β per domain and BN layer (mean over meta-train seeds), {m}, {r['kind']} shift α = {r['alpha']:g} "
                          "(seen clients)", "", *domain_betas(v["beta_per_domain"]), ""]
            if "sweep" in r:
                lrs = list(next(iter(r["sweep"].values())))
                lines += [f"What the data asks for, {r['kind']} shift α = {r['alpha']:g}: test accuracy (%) of FT with one fixed β "
                          f"in every BN layer, at LR {' and '.join(lrs)} (seen clients, seed 0)", "",
                          *tables.lines(["domain", "LR", *(f"β={b:g}" for b in SWEEP), "best β"],
                                        ([d, lr, *(f"{100 * a:.2f}" for a in by_lr[lr]), f"{SWEEP[int(np.argmax(by_lr[lr]))]:g}"]
                                         for d, by_lr in r["sweep"].items() for lr in lrs)), ""]
            if "client_bn" in r:
                cmp_ = r["client_bn"]
                ms = list(cmp_["running"])
                lines += [f"Client BN statistics, {r['kind']} shift α = {r['alpha']:g}, seen clients: test accuracy (%) with the "
                          "paper's running statistics vs recomputed ones (PreciseBN), same clients, seeds and batches", "",
                          *tables.lines(["client statistics", *ms],
                                        ([k, *(f"{100 * cmp_[k].get(m, np.nan):.2f}" for m in ms)] for k in cmp_)), ""]
            if "ari" in r:
                lines += [f"ARI vs true domains, {r['kind']} shift α = {r['alpha']:g} (seen clients): "
                          + ", ".join(f"{k} {a:.3f}" if isinstance(a, float) else f"{k} {a}" for k, a in r["ari"].items()), ""]
    return "\n".join(lines)


def domain_betas(per_domain: dict[str, list[float]]) -> list[str]:
    """β by domain (rows) and BN layer (columns), and each layer's spread over the domains."""
    spread = np.ptp(np.array(list(per_domain.values())), axis=0)
    return tables.lines(["domain", *(f"bn{i}" for i in range(len(spread)))],
                        [*([d, *(f"{b:.3f}" for b in bs)] for d, bs in per_domain.items()),
                         ["spread (max − min)", *(f"{b:.3f}" for b in spread)]])


def meta_runs(personalize_id: str) -> list[dict]:
    """Each learned row's meta-train run, from its history.csv: eta~ after the last round and at most (x its start),
    the round whose lambda was kept, divergence, and the sampled clients' validation loss in the first and last round."""
    import csv

    from fedl2p_cli.artifacts import Store
    store = Store(STORE)
    out = []
    for k, i in store.load("personalize", personalize_id, verify=False).parents.items():
        if not k.startswith("meta-train:"):
            continue
        art = store.load("meta-train", i, verify=False)
        with open(art.file("history.csv")) as f:
            h = list(csv.DictReader(f))
        eta = [float(x["etatilde_x"]) for x in h if x.get("etatilde_x")]  # none when the LRs are fixed (nets=bnnet)
        out.append({"variant": art.metrics["variant"], "id": i, "eta_last": eta[-1] if eta else float("nan"),
                    "eta_max": max(eta, default=float("nan")), "eta_min": min(eta, default=float("nan")),
                    "kept_round": art.metrics.get("kept_round"), "rounds_run": art.metrics.get("rounds_run"),
                    "diverged": art.metrics.get("diverged"), "val_first": float(h[0]["val_loss"]) if h else float("nan"),
                    "val_last": float(h[-1]["val_loss"]) if h else float("nan")})
    return out


def runs_report(done: list[list[dict]]) -> str:
    """One line per cell and meta-train seed: how the stable IFT's learning went."""
    lines = ["The meta-train runs: η̃ (mean over tensors, × its start) after the last round and its range over the rounds, "
             "the round whose λ was kept, and the sampled clients' mean validation loss in the first and last round.", "",
             *tables.lines(["cell", "run", "η̃ last (min–max)", "kept round", "end", "val. loss first → last"],
                           ([cell[0]["cell"], m["variant"], f"{m['eta_last']:.2f} ({m['eta_min']:.2f}–{m['eta_max']:.2f})",
                             m["kept_round"], f"diverged: {m['diverged']}" if m["diverged"] else f"stable, {m['rounds_run']} rounds",
                             f"{m['val_first']:.3f} → {m['val_last']:.3f}"] for cell in done for m in cell[0]["runs"]))]
    return "\n".join(lines) + "\n"


def central_report(done: list[list[dict]]) -> str:
    """Label-shift cells' pretrained global model beside the same model trained centrally ("" if none was)."""
    ls = [r for cell in done for r in cell if r["kind"] == "label" and r["pool"] == "seen" and "central_acc" in r]
    if not ls:
        return ""
    return ("\nPretrained global model (FedAvg) vs the same model trained centrally on the same seen clients' images "
            "(10 epochs), pooled seen test sets:\n\n"
            + tables.markdown(["α", "FedAvg", "central"], ([f"{r['alpha']:g}", f"{100 * r['pretrain_seen_acc']:.2f}",
                                                            f"{100 * r['central_acc']:.2f}"] for r in ls)) + "\n")


def speech_beta(r: dict) -> list[str]:
    """β per BN layer on a speaker cell (mean over the pool's clients and the meta-train seeds)."""
    out = []
    for m, v in over_meta_seeds(r["methods"]).items():
        if "beta_per_domain" not in v:
            continue
        (pool, bs), = v["beta_per_domain"].items()
        out += [f"β per BN layer, {m}, {pool} ({r['pool']} pool; mean over its clients and the meta-train seeds): "
                + ", ".join(f"bn{i} {b:.3f}" for i, b in enumerate(bs)), ""]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cells", nargs="*", default=list(CELLS), help=f"cells to run: {', '.join(CELLS)}")
    ap.add_argument("--jobs", type=int, default=2, help="processes (one torch thread each)")
    ap.add_argument("--report-only", action="store_true", help="only write the report from finished cells")
    ap.add_argument("--stable-ift", action="store_true", help="only each cell's stable-IFT meta-train runs, with the "
                    "hand-made methods on the same clients and batches: bench/accuracy-ift.md")
    ap.add_argument("--new-only", action="store_true", help="on finished cells, run only the groups every cell shares "
                    "(the beta-init variant; the other personalised-FL systems on feature-shift cells)")
    args = ap.parse_args()
    bad = [c for c in args.cells if c not in CELLS]
    if bad:
        sys.exit(f"error: unknown cell '{bad[0]}'; cells are: {', '.join(CELLS)}")
    if args.new_only:
        with mp.get_context("spawn").Pool(args.jobs) as pool:
            pool.starmap(run_extras, [(c, False) for c in args.cells], chunksize=1)
    elif not args.report_only:
        ctx = mp.get_context("spawn")
        if any(CELLS[c][0] in SHIFTED for c in args.cells):  # its model is shared: build it once, first
            run_cell("ls-1000", False)
        if args.jobs == 1 or len(args.cells) == 1:  # in this process: its meta-trains may use worker processes
            for c in args.cells:
                run_cell(c, True, args.stable_ift)
        else:
            with ctx.Pool(args.jobs) as pool:
                pool.starmap(run_cell, [(c, True, args.stable_ift) for c in args.cells], chunksize=1)
    done, central = [], {}
    for c in CELLS:
        rows = collect(c, args.stable_ift)
        if rows is None:
            print(f"[{c}] not complete; left out of the report")
            continue
        for r in rows:
            if r["kind"] in SHIFTED and r["pool"] == "seen":
                r["ari"] = cluster_rows(c, r)
            if args.stable_ift:  # the learning runs themselves; the cell's other measurements do not depend on them
                r["runs"] = meta_runs(r["personalize"])
                continue
            if r["kind"] in SHIFTED and r["pool"] == "seen":
                cache = HERE / f".sweep-lrs-{r['personalize']}.json"  # a pure function of the artifact: computed once
                if not cache.is_file():
                    cache.write_text(json.dumps(beta_sweep(r["personalize"])))
                r["sweep"] = json.loads(cache.read_text())
                if c == "fs-1000":  # one cell: each comparison re-runs every method's fine-tuning
                    r["client_bn"] = stats_comparison(r)
            if r["kind"] == "label":
                key = r["pretrain_partition"]
                central.setdefault(key, central_accuracy(key, sections(c, full=False)["pretrain"]))
                r["central_acc"] = central[key]
        done.append(rows)
    text = report(done) + central_report(done) + "\n" + beta_report(done)
    if args.stable_ift:
        text += "\n" + runs_report(done)
    out = "accuracy-ift" if args.stable_ift else "accuracy"
    (HERE / f"{out}.md").write_text(text)
    (HERE / f"{out}.json").write_text(json.dumps([r for cell in done for r in cell], indent=2, default=float))
    print(text)


if __name__ == "__main__":
    main()
