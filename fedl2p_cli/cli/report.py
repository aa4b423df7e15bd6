from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import typer

from ..errors import FedL2PError
from ..runtime import Runtime
from . import options, render

stage = options.Lazy("fedl2p_cli.stages.report")
files = options.Lazy("fedl2p_cli.stages.pipeline_files")


def report(
    ctx: typer.Context,
    sources: list[str] = typer.Argument(..., help="Pipeline files (.toml) or shipped pipelines' names, and/or artifact "
                                        "ids (each with its lineage); "
                                        "several are shown side by side in one page.", show_default=False),
    out: Path | None = typer.Option(None, "--out", "-o", help="Also copy the page to this file (the artifact keeps "
                                       "its own copy in the store)."),
    force: bool = options.FORCE,
    store: Path | None = options.STORE,
) -> None:
    """One self-contained HTML page of pipelines or artifacts: lineage, configs, results, β/η, ARI, plots, timings."""
    if out is not None:
        writable(out)
    art, reused = write(sources, store, force, options.store_runtime(ctx))
    if out is not None:
        try:
            shutil.copyfile(art.file("report.html"), out)
        except OSError as e:
            raise FedL2PError(f"--out {out}: cannot write ({e.strerror})") from None
        render.console.print(f"report copied to {out}")
    render.artifact_line("report", art.id, art.file("report.html"), reused)


def writable(out: Path) -> None:
    """--out can be written, checked before the report artifact is: a refused command leaves the store as it was."""
    if out.is_dir():
        raise FedL2PError(f"--out {out} is a folder; give a file name such as {out / 'report.html'}")
    try:
        with tempfile.NamedTemporaryFile(dir=out.parent if str(out.parent) else ".", prefix=".fedl2p-"):
            pass
    except OSError as e:
        raise FedL2PError(f"--out {out}: cannot write ({e.strerror or e.__class__.__name__})") from None


def write(sources: list[str], store: Path | None, force: bool = False, runtime: Runtime | None = None):
    """The report artifact of `sources` (pipeline files or artifact ids) in `store` (default: the first pipeline's),
    built on `runtime` (the command's: how it waits for the store's lock, what it logs to)."""
    sections, root = [], None
    for src in sources:
        if src.endswith(".toml") or Path(src).is_file() or src in dict(files.shipped()):  # a file or a shipped name
            section, st = stage.from_pipeline(files.find(src), store, runtime)
            root = root or st
        else:
            section = None
        sections.append(section or src)
    root = root or options.store(store)
    sections = [s if not isinstance(s, str) else stage.from_artifact(root, s) for s in sections]
    return options.execute(stage, sections, {}, root.root, runtime or Runtime(), force)
