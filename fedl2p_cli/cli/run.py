from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import options, personalize, render

pipeline = options.Lazy("fedl2p_cli.stages.pipeline")


def run(
    file: Annotated[Path, typer.Argument(help="Pipeline TOML file (see pipelines/).", show_default=False)],
    force: Optional[str] = typer.Option(None, "--force", help="Re-run this stage and every later one even if their artifacts exist."),
    store: Optional[Path] = options.STORE,
) -> None:
    """Run partition -> pretrain -> stats -> meta-train -> personalize -> analyze, reusing existing artifacts."""
    p = pipeline.load(file, store)
    render.console.print(f"[bold]pipeline {p.name}[/bold] (store {p.store.root})")
    results = pipeline.run(p, force, render.RichProgress,
                           lambda r: render.artifact_line(f"{r.stage} [{r.label}]", r.artifact.id, r.artifact.path, r.reused))
    for r in results:
        if r.stage == "personalize":
            personalize.show(json.loads(r.artifact.file("summary.json").read_text()))
        if r.stage == "analyze":
            a = json.loads(r.artifact.file("ari.json").read_text())
            render.table(f"ARI vs true domains ({a['pool']} clients)", ["feature", "ARI"], [[k, v] for k, v in a["ari"].items()])
    rows = [[r.stage, r.label, r.artifact.id, "reused" if r.reused else "built",
             " ".join(p.name for p in sorted(r.artifact.path.glob("*.png")))] for r in results]
    render.table("artifacts", ["stage", "what", "id", "", "plots"], rows)
    render.console.print(f"plots and tables live under {p.store.root}/<stage>/<id>/")
