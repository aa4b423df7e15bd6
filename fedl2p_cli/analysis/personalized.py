"""How a personalisation's summary reads: its table rows, β per domain, the spread lines and summary.md. Shared by
`fedl2p personalize`, its artifact's summary.md and the report."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import methods
from . import per_kind, spread
from .text import signed

if TYPE_CHECKING:
    from ..catalog import Catalog


def fixed(m: str, catalog: Catalog) -> bool:
    """A hand-made method: one strategy for every client (the registry's HandMade)."""
    return isinstance(methods.find(m, catalog), methods.HandMade)


def markdown(s: dict, catalog: Catalog) -> str:
    """summary.md: the rows, β per domain and the spread lines (`catalog`: the rows' methods, for their labels)."""
    lines = [f"Personalised test accuracy, {s['pool']} clients ({s['clients']}), mean ± SD over seeds {s['seeds']}", "",
             "| method | accuracy (%) | Δ vs best FT | Δ vs FT tuned | clients better | sparsity |", "|---|---|---|---|---|---|",
             f"| global model | {100 * s['global_acc']:.2f} | | | | |"]
    for m, v in s["methods"].items():
        lines.append("| " + " | ".join(row_cells(m, v, catalog)) + " |")
    for m, v in s["methods"].items():
        if "beta_per_domain" in v:
            title, cols, rows = beta_table(m, v["beta_per_domain"], catalog)
            lines += ["", f"{title} (mean over a domain's clients)", "",
                      "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            lines += ["| " + " | ".join(r) + " |" for r in rows]
    for title, cols, rows in kind_tables(s.get("per_kind") or {}, catalog):
        lines += ["", title, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    if behind := behind_lines(s.get("per_kind") or {}, catalog):
        lines += [""] + behind
    spreads = spread_lines(s, catalog)
    if spreads:
        lines += ["", "Are the strategies personal? (spread across clients and domains)", ""] + [f"- {x}" for x in spreads]
    return "\n".join(lines) + "\n"


def spread_lines(s: dict, catalog: Catalog) -> list[str]:
    """Per learned row: the spread of its β and LRs across clients and domains beside its round-0 control, and one
    line when every client got (nearly) the same strategy; a checked row's picks and ft-tuned's grid edge per kind."""
    out = [line for m, v in s["methods"].items()
           for line in spread.lines(methods.label(m, catalog), v.get("spread") or {}, v.get("spread_round0"))]
    for m, v in s["methods"].items():
        if "picks" in v:
            out.append(f"{methods.label(m, catalog)} picked (seed × client, per kind): " + "; ".join(
                f"{k} " + ", ".join(f"{lab} {n}" for lab, n in c.items()) for k, c in v["picks"].items()))
        if "edge" in v:
            out.append(f"{methods.label(m, catalog)} picked its grid's largest LR (×10) for " + ", ".join(
                f"{k} {100 * x:.0f}%" for k, x in v["edge"].items() if k != "all")
                + f" of clients (all: {100 * v['edge']['all']:.0f}%); where that is often, the grid's edge limits it")
    return out


def beta_table(m: str, per_domain: dict[str, list[float]], catalog: Catalog) -> tuple[str, list[str], list[list[str]]]:
    """Title, columns and rows of a learned method's β by domain (rows) and BN layer (columns): what an ARI alone
    hides, how far apart the domains' β are."""
    n = len(next(iter(per_domain.values())))
    return (f"β per domain and BN layer, {methods.label(m, catalog)}",
            ["domain"] + [f"bn{i}" for i in range(n)], [[d] + [f"{b:.2f}" for b in bs] for d, bs in per_domain.items()])


def row_cells(m: str, v: dict, catalog: Catalog) -> list[str]:
    """One summary row: label, mean ± SD, Δ vs best FT, Δ vs ft-tuned, share of clients better, sparsity."""
    fmt = lambda k: signed(100 * v[k]) if k in v else ""  # noqa: E731
    if np.isnan(v["mean"]):  # e.g. pFedLA on unseen clients: it has no model for them
        return [methods.label(m, catalog), "N/A", "", "", "", ""]
    return [methods.label(m, catalog), f"{100 * v['mean']:.2f} ± {100 * v['sd']:.2f}", fmt("vs_best_baseline"), fmt("vs_ft_tuned"),
            f"{100 * v['clients_better']:.0f}%" if "clients_better" in v else "",
            f"{v['sparsity']:.3f}" if v.get("sparsity") is not None else ""]


def roles(names: list[str], catalog: Catalog) -> per_kind.Roles:
    """A personalisation's rows by role: the fixed FTs each kind is measured against, the tuned row, the learned rows."""
    tuned = next((m for m in names if isinstance(methods.find(m, catalog), methods.Tuned)), None)
    hand = set(methods.handmade(catalog))
    return per_kind.Roles(tuple(m for m in names if m in methods.baselines(catalog)), tuned,
                          tuple(m for m in names if m not in hand))


def _pm(v: dict, scale: float = 100.0) -> str:
    return f"{scale * v['mean']:.2f} ± {scale * v['sd']:.2f}"


def _delta(v: dict | None) -> str:
    return "—" if v is None else f"{signed(100 * v['mean'])} ± {100 * v['sd']:.2f}"


def kind_tables(pk: dict, catalog: Catalog) -> list[tuple[str, list[str], list[list[str]]]]:
    """Title, columns and rows of the per-kind tables (none for a pool of one kind): each row's accuracy per kind, and
    each non-fixed row's paired Δ per kind against the kind's best fixed FT and against ft-tuned."""
    if not pk:
        return []
    kinds, rows = pk["kinds"], pk["rows"]
    acc = [[methods.label(m, catalog), *[_pm(v[k]) if k in v else "—" for k in kinds]] for m, v in rows.items()]
    best = ", ".join(f"{k} {methods.label(m, catalog)}" for k, m in pk["best_fixed"].items())
    deltas = [[f"{methods.label(m, catalog)} {what}", *[_delta(v.get(k, {}).get(key)) for k in kinds]]
              for m, v in rows.items() for key, what in (("vs_best_fixed", "vs best FT"), ("vs_ft_tuned", "vs FT tuned"))
              if any(key in v.get(k, {}) for k in kinds)]
    out = [("Accuracy (%) per kind of client, mean ± SD over seeds", ["method", *kinds], acc)]
    if deltas:
        out.append((f"Paired Δ per kind (points, mean ± SD over seeds); the kind's best fixed FT: {best}",
                    ["method", *kinds], deltas))
    return out


def behind_lines(pk: dict, catalog: Catalog) -> list[str]:
    """One line per learned row naming each kind it leaves below the kind's best fixed FT or more than 2 points below
    ft-tuned (what a pool mean hides), or saying that it leaves none."""
    out = []
    for m in pk.get("learned", []) if pk else []:
        kinds = pk.get("left_behind", {}).get(m, [])
        if not kinds:
            out.append(f"{methods.label(m, catalog)}: no kind below its best fixed FT or more than 2 points below FT tuned")
            continue
        parts = []
        for k in kinds:
            v = pk["rows"][m][k]
            ref = methods.label(pk["best_fixed"][k], catalog) if k in pk["best_fixed"] else "best FT"
            parts.append(f"{k} ({_delta(v.get('vs_best_fixed'))} vs {ref}, {_delta(v.get('vs_ft_tuned'))} vs FT tuned)")
        out.append(f"{methods.label(m, catalog)} leaves kinds behind: " + "; ".join(parts))
    return out
