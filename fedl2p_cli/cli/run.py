from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from .. import plugins
from ..errors import FedL2PError
from ..stages import pipeline_files as files
from . import options, personalize, render

pipeline = options.Lazy("fedl2p_cli.stages.pipeline")


def run(
    ctx: typer.Context,
    file: Annotated[str | None, typer.Argument(help="Pipeline TOML file, or the name of a shipped pipeline (--list).",
                                                  show_default=False)] = None,
    force: str | None = typer.Option(None, "--force", help="Re-run this stage and every later one even if their artifacts exist."),
    store: Path | None = options.STORE,
    list_: bool = typer.Option(False, "--list", help="List the shipped pipelines, one line each, and exit."),
    show: bool = typer.Option(False, "--show", help="Print the pipeline as one self-contained file (its extends "
                              "resolved) instead of running it: `fedl2p run --show quickstart > my.toml`."),
    report: bool = typer.Option(False, "--report", help="At the end, also write the one-page HTML report of this "
                                "pipeline (`fedl2p report FILE`)."),
) -> None:
    """Run partition -> pretrain -> stats -> meta-train -> personalize -> analyze, reusing existing artifacts."""
    if list_:
        names = files.shipped()
        width = max(len(n) for n, _ in names)
        for n, f in names:  # plain lines, one a pipeline: greppable, never wrapped into a table's cells
            typer.echo(f"{n:<{width}}  {files.description(f)}")
        return
    if file is None:
        raise FedL2PError("give a pipeline file or a shipped pipeline's name (`fedl2p run --list` lists them)")
    path = files.find(file)
    if show:
        sys.stdout.write(files.show(path))
        return
    p = pipeline.load(path, store)
    plugins.load(p.plugins, f"pipeline {path}")  # into this command's catalog, which its runtime carries
    render.plugin_notes()  # the pipeline's own plugins'
    rt = options.runtime(ctx, device=p.device)
    rt = rt.replace(allow_import=(*rt.allow_import, *pipeline.named_modules(p)))  # named by the user: its stages may import them
    render.console.print(f"[bold]pipeline {p.name}[/bold] (store {p.store.root})")
    results = pipeline.run(p, force, render.RichProgress,
                           lambda r: render.artifact_line(f"{r.stage} [{r.label}]", r.artifact.id, r.artifact.path, r.reused),
                           runtime=rt)
    for r in results:
        m = r.artifact.metrics
        if r.stage == "meta-train" and m.get("diverged"):
            render.err_console.print(f"[yellow]warning:[/yellow] meta-train [{r.label}] diverged in {m['diverged']}; "
                                     f"kept {m.get('kept', 'the best lambda so far')}")
        if r.stage == "personalize":
            personalize.show(json.loads(r.artifact.file("summary.json").read_text()), plugins.of(rt))
        if r.stage == "analyze":
            a = json.loads(r.artifact.file("ari.json").read_text())
            render.table(f"ARI vs true domains ({a['pool']} clients)", ["feature", "ARI"], [[k, v] for k, v in a["ari"].items()])
    rows = [[r.stage, r.label, r.artifact.id, "reused" if r.reused else "built",
             " ".join(p.name for p in sorted(r.artifact.path.glob("*.png")))] for r in results]
    render.table("artifacts", ["stage", "what", "id", "", "plots"], rows)
    render.console.print(f"plots and tables live under {p.store.root}/<stage>/<id>/")
    if report:
        from .report import write
        art, reused = write([str(path)], store, runtime=options.store_runtime(ctx))
        render.artifact_line("report", art.id, art.file("report.html"), reused)
    else:
        render.console.print(f"one HTML page of it all: fedl2p report {path}" + (f" --store {store}" if store else ""))
