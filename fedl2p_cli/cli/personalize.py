from __future__ import annotations

import json
from pathlib import Path

import typer

from .. import plugins
from ..catalog import Catalog
from ..configs import PersonalizeConfig
from ..runtime import Runtime
from . import options, render
from .generate import config_command

stage = options.Lazy("fedl2p_cli.stages.personalize")


@config_command(PersonalizeConfig, runtime=("client_batch",))
def personalize(
    cfg: PersonalizeConfig,
    rt: Runtime,
    meta: list[str] | None = typer.Option(None, "--meta", help="A meta-train artifact id to compare as well (repeatable)."),
    pfl: list[str] | None = typer.Option(None, "--pfl", help="A pfl-train artifact id to compare as well (repeatable, one "
                                            "per system); default: each system in --methods takes its newest."),
    pretrain: str | None = options.PRETRAIN,
    stats: str | None = options.STATS,
    force: bool = options.FORCE,
    store: Path | None = options.STORE,
) -> None:
    """Fine-tune every client of the pool under each method -> results.h5, summary.md/json, beta/eta plots."""
    art, reused = options.execute(stage, cfg, {"pretrain": pretrain, "stats": stats, "meta": meta, "pfl": pfl}, store, rt,
                                  force, progress=render.RichProgress())
    show(json.loads(art.file("summary.json").read_text()), plugins.of(rt))
    render.artifact_line("personalize", art.id, art.path, reused)


def show(s: dict, catalog: Catalog) -> None:
    """A personalisation's summary as the terminal's tables (`catalog`: the command's, for the rows' labels)."""
    rows = [["global model", f"{100 * s['global_acc']:.2f}", "", "", "", ""]]
    rows += [stage.row_cells(m, v, catalog) for m, v in s["methods"].items()]
    render.table(f"personalised accuracy (%), {s['pool']} clients ({s['clients']}), seeds {s['seeds']}",
                 ["method", "accuracy", "Δ vs best FT", "Δ vs FT tuned", "clients better", "sparsity"], rows)
    for m, v in s["methods"].items():
        if "beta_per_domain" in v:
            title, cols, brows = stage.beta_table(m, v["beta_per_domain"], catalog)
            render.table(f"{title} ({s['pool']} clients)", cols, brows)
    for title, cols, krows in stage.kind_tables(s.get("per_kind") or {}, catalog):
        render.table(f"{title}, {s['pool']} clients", cols, krows)
    for line in stage.behind_lines(s.get("per_kind") or {}, catalog):
        print(line, flush=True)
    for line in stage.spread_lines(s, catalog):
        print(line, flush=True)
