from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..artifacts import STAGES
from ..errors import FedL2PError
from . import options, render

app = typer.Typer(help="See what the store holds and where it came from.", no_args_is_help=True)


def _stage(stage: str) -> str:
    if stage not in STAGES:
        raise FedL2PError(f"unknown stage '{stage}'; stages are: {', '.join(STAGES)}")
    return stage


@app.command("list")
def list_(stage: Optional[str] = typer.Argument(None, help="Only this stage."), store: Optional[Path] = options.STORE) -> None:
    """One row per artifact: stage, id, created, parents, headline metrics."""
    s = options.store(store)
    rows = []
    for art in s.iter(_stage(stage) if stage else None):
        m = {k: v for k, v in art.metrics.items() if isinstance(v, (int, float))}
        rows.append([art.stage, art.id, art.manifest["created"], " ".join(f"{k}:{v}" for k, v in art.parents.items()),
                     " ".join(f"{k}={v:.4g}" for k, v in list(m.items())[:4])])
    render.table(f"artifacts in {s.root}", ["stage", "id", "created", "parents", "metrics"], rows)


@app.command()
def show(stage: str = typer.Argument(..., help="Stage name."), ref: Optional[str] = typer.Argument(None, help="Id or prefix; default newest."),
         store: Optional[Path] = options.STORE) -> None:
    """Print an artifact's manifest (config, parents, file hashes, metrics)."""
    art = options.store(store).load(_stage(stage), ref, verify=False)
    render.console.print_json(json.dumps(art.manifest, default=str))


@app.command()
def verify(stage: Optional[str] = typer.Argument(None, help="Only this stage."), store: Optional[Path] = options.STORE) -> None:
    """Re-hash every file of every artifact; exit 1 if any fails."""
    s = options.store(store)
    bad = 0
    for art in s.iter(_stage(stage) if stage else None):
        try:
            s.verify(art)
            render.console.print(f"[green]ok[/green]   {art.stage}/{art.id}")
        except FedL2PError as e:
            bad += 1
            render.console.print(f"[red]FAIL[/red] {e}")
    if bad:
        raise typer.Exit(1)
