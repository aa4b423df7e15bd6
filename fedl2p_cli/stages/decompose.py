"""`fedl2p analyze decompose`: which half of a learned strategy helps. A FedL2P strategy is a pair (beta, eta) per
client; this re-runs a personalisation's learned method on the same clients, seeds and batches with one half swapped
for a fixed choice (beta fixed for every BN layer; eta at the base LR for every tensor), and with its learned LRs
scaled, and with one BN layer's beta set to a value (every layer in turn, the rest learned). It reports every
combination with its paired difference to the learned strategy, overall and per domain, next to the stored FT
baselines, and the learned eta's ratio to the base LR per parameter tensor."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import torch

from .. import methods
from ..analysis.text import signed
from ..artifacts import Artifact, Draft
from ..catalog import Catalog
from ..configs import DecomposeConfig
from ..core.config import validate
from ..core.finetune import Strategy
from ..errors import FedL2PError
from .common import NoProgress, build_or_reuse, config_dict
from .harness import Harness
from .interface import Inputs, StageContext
from .rows import META_TRAIN, PARTITION, PERSONALIZE, PRETRAIN, STATS


def combos(beta: np.ndarray, eta: np.ndarray, b_fixed: float, base_lr: float, scales: list[float],
           layer_betas: Sequence[float] = ()) -> dict[str, tuple]:
    """The strategies compared, the learned one first."""
    fixed_b, base_e = np.full_like(beta, b_fixed), np.full_like(eta, base_lr)
    out = {"learned beta, learned eta": (beta, eta), "learned beta, base LR": (beta, base_e),
           f"beta {b_fixed:g}, learned eta": (fixed_b, eta), f"beta {b_fixed:g}, base LR": (fixed_b, base_e)}
    out |= {f"learned beta, learned eta x {s:g}": (beta, eta * np.float32(s)) for s in scales}
    return out | {f"learned, BN layer {layer} beta {v:g}": (_with(beta, layer, v), eta)
                  for layer in range(len(beta)) for v in layer_betas}


def _with(beta: np.ndarray, layer: int, value: float) -> np.ndarray:
    out = beta.copy()
    out[layer] = value
    return out


def _rows(names: list[str], m: np.ndarray) -> dict:
    """m [combos, seeds] (percent) -> per combination: mean ± SD over seeds and the paired difference to the first."""
    return {n: {"mean": float(m[i].mean()), "sd": float(m[i].std()), "vs_learned": float((m[i] - m[0]).mean()),
                "vs_learned_sd": float((m[i] - m[0]).std())} for i, n in enumerate(names)}


def summary(names: list[str], acc: np.ndarray, stored: dict[str, np.ndarray], domain: np.ndarray,
            domain_names: list[str]) -> dict:
    """acc [combos, seeds, clients] -> per combination: mean ± SD over seeds of the clients' mean (percent) and the
    paired difference to the learned strategy, over all clients and over each domain's; the stored rows as they are."""
    by_domain = {domain_names[d]: _rows(names, 100 * acc[:, :, domain == d].mean(axis=2)) for d in np.unique(domain)}
    return {"combinations": _rows(names, 100 * acc.mean(axis=2)), "by_domain": by_domain,
            "stored": {k: {"mean": float(v.mean()), "sd": float(v.std())} for k, v in stored.items()}}


def domain_cells(s: dict) -> tuple[list[str], dict[str, list[str]]]:
    """The per-domain columns of a summary where it has several domains (none otherwise): the domains, and per
    combination its cells, "accuracy (Δ vs learned)". Shared by summary.md and the command's table."""
    doms = list(s["by_domain"]) if len(s["by_domain"]) > 1 else []
    return doms, {n: [f"{s['by_domain'][d][n]['mean']:.2f} ({signed(s['by_domain'][d][n]['vs_learned'])})" for d in doms]
                  for n in s["combinations"]}


def markdown(s: dict, method: str, pool: str, clients: int, ratio: np.ndarray, beta: np.ndarray, params: list[str],
             catalog: Catalog) -> str:
    lines = [f"{method} on {clients} {pool} clients: accuracy (%) mean ± SD over seeds, Δ paired vs the learned strategy", "",
             "| strategy | accuracy | Δ vs learned |", "|---|---|---|"]
    lines += [f"| {n} | {v['mean']:.2f} ± {v['sd']:.2f} | {signed(v['vs_learned'])} ± {v['vs_learned_sd']:.2f} |"
              for n, v in s["combinations"].items()]
    lines += [f"| {methods.label(k, catalog)} (stored) | {v['mean']:.2f} ± {v['sd']:.2f} | |" for k, v in s["stored"].items()]
    doms, cells = domain_cells(s)
    if doms:  # does a change help one kind of client and cost another?
        lines += ["", "By domain: accuracy (Δ vs learned, paired)", "", "| strategy | " + " | ".join(doms) + " |",
                  "|---|" + "---|" * len(doms)]
        lines += [f"| {n} | " + " | ".join(c) + " |" for n, c in cells.items()]
    lines += ["", "Learned beta, mean per BN layer: " + " / ".join(f"{v:.2f}" for v in beta.mean(0)), "",
              "| tensor | learned eta / base LR: mean | min | max |", "|---|---|---|---|"]
    lines += [f"| {p} | {col.mean():.2f} | {col.min():.2f} | {col.max():.2f} |" for p, col in zip(params, ratio.T)]
    return "\n".join(lines) + "\n"


def execute(cfg: DecomposeConfig, inputs: Inputs, ctx: StageContext) -> tuple[Artifact, bool]:
    """The stage interface (`fedl2p analyze decompose`): the `personalize` run among the inputs (default: the
    newest)."""
    validate(cfg)
    store, runtime, progress = ctx.store, ctx.runtime, ctx.progress
    pers = inputs.get(PERSONALIZE)
    art, r = pers.artifact, pers.value.results
    learned = [m for m in pers.value.learned if not np.isnan(r.eta[m]).all()]
    if not learned or (cfg.method is not None and cfg.method not in learned):
        raise FedL2PError(f"personalize {art.id} has no learned method {cfg.method or ''}".rstrip() +
                          f" to take apart (learned: {', '.join(learned) or 'none'})")
    method = cfg.method or learned[0]
    meta_id = art.parents[f"meta-train:{method}"]
    b_fixed = cfg.beta if cfg.beta is not None else pers.parent(META_TRAIN, method).value.cfg.meta.beta_init
    parents = {"personalize": art.id, "meta-train": meta_id}

    def build(draft: Draft) -> None:
        model, state = pers.parent(PRETRAIN).value
        table, part = pers.parent(STATS).value, pers.parent(PARTITION).value
        pc = art.config
        base_lr = float(pc["base_lr"])
        h = Harness.on(runtime.torch_device, model, state, part, table, int(pc["epochs"]), int(pc["batch_size"]),
                    pc.get("client_bn", "precise"))
        per_client = [combos(r.beta[method][j], r.eta[method][j], b_fixed, base_lr, cfg.eta_scales, cfg.layer_betas)
                      for j in range(len(r.client))]
        names = list(per_client[0])
        acc = np.full((len(names), len(r.seeds), len(r.client)), np.nan)
        bar = progress or NoProgress()
        bar.start(f"decompose {method}", len(r.client))
        for j, c in enumerate(int(c) for c in r.client):
            client = h.client(c)
            for i, (b, e) in enumerate(per_client[j].values()):
                s = Strategy(torch.from_numpy(b), torch.from_numpy(e))
                for k, seed in enumerate(r.seeds):  # the personalisation's batches: paired with its stored rows
                    acc[i, k, j] = h.finetune(client, s, seed).evaluate("test", pc.get("eval_stats", "running"))[1]
            bar.advance(1)
        bar.stop()
        stored = {m: 100 * r.acc_after[r.methods.index(m)].mean(axis=1)
                  for m in (method, *methods.baselines(ctx.catalog)) if m in r.methods}
        summ = summary(names, acc, stored, part.domain[np.asarray(r.client, dtype=np.int64)], list(part.domain_names))
        draft.path("summary.json").write_text(json.dumps(summ | {"method": method, "beta_fixed": b_fixed}, indent=2))
        draft.path("summary.md").write_text(markdown(summ, method, r.pool, len(r.client), r.eta[method] / base_lr,
                                                     r.beta[method], table.param_names, ctx.catalog))
        draft.metrics = {n: v["mean"] for n, v in summ["combinations"].items()}

    return build_or_reuse(store, "analyze", {"analysis": "decompose", **config_dict(cfg) | {"method": method, "beta": b_fixed}},
                          parents, build, ctx.force, runtime)
