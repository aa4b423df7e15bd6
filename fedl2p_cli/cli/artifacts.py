from __future__ import annotations

import json
from pathlib import Path

import typer

from ..errors import FedL2PError
from ..stage_table import TABLE
from . import options, render

app = typer.Typer(help="See what the store holds and where it came from.", no_args_is_help=True)


def _stage(stage: str) -> str:
    if stage not in TABLE.names:
        raise FedL2PError(f"unknown stage '{stage}'; stages are: {', '.join(TABLE.names)}")
    return stage


@app.command("list")
def list_(stage: str | None = typer.Argument(None, help="Only this stage."), store: Path | None = options.STORE) -> None:
    """One row per artifact: stage, id, created, parents, headline metrics."""
    s = options.store(store)
    rows, missing = [], set()
    for art in s.iter(_stage(stage) if stage else None):
        missing.update(missing_plugins(art))
        m = {k: v for k, v in art.metrics.items() if isinstance(v, (int, float))}
        rows.append([art.stage, art.id, art.manifest["created"], " ".join(f"{k}:{v}" for k, v in art.parents.items()),
                     " ".join(f"{k}={v:.4g}" for k, v in list(m.items())[:4])])
    render.table(f"artifacts in {s.root}", ["stage", "id", "created", "parents", "metrics"], rows)
    for line in sorted(missing):
        render.err_console.print(line, highlight=False, markup=False)


def missing_plugins(art) -> list[str]:
    """A line per plugin the artifact was made with that is not installed here (its files stay readable; what
    needs the plugin's pieces, such as building on it, does not work until it is)."""
    from ..plugins import importable
    return [f"note: {art.stage}/{art.id} was made with plugin {p.get('module')} ({p.get('dist') or 'not a package'} "
            f"{p.get('version') or ''}), not installed here".replace(" )", ")")
            for p in art.manifest.get("plugins") or [] if p.get("module") and not importable(str(p["module"]))]


@app.command()
def show(stage: str = typer.Argument(..., help="Stage name."),
         ref: str | None = typer.Argument(None, help="Id or prefix; default newest."),
         store: Path | None = options.STORE) -> None:
    """Print an artifact's manifest (config, parents, file hashes, metrics)."""
    art = options.store(store).load(_stage(stage), ref, verify=False)
    render.console.print_json(json.dumps(art.manifest, default=str))
    for line in missing_plugins(art):
        render.err_console.print(line, highlight=False, markup=False)


@app.command()
def verify(stage: str | None = typer.Argument(None, help="Only this stage."), store: Path | None = options.STORE) -> None:
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
