"""Terminal output: progress bars, tables, one-line errors.

On a terminal, tables are rich boxes. Anywhere else (a pipe, a log file, CI) they are Markdown tables and lines are
never wrapped: rich would fold them into 80-column boxes that a log keeps unreadable."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from ..analysis import tables

# a long line (an artifact path) stays one line; rich boxes still fit the terminal. No emoji codes: a user's text
# reaches the terminal as typed (`--model no.such.module:factory` is not "no.such.module🏭")
console = Console(soft_wrap=True, emoji=False)
err_console = Console(stderr=True, soft_wrap=True, emoji=False)


class RichProgress:
    """Implements stages.common.Progress with a rich bar; `info` shows the latest metrics."""

    def __init__(self) -> None:
        self._p: Progress | None = None
        self._task: TaskID | None = None

    def start(self, description: str, total: int) -> None:
        self._p = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                           console=err_console, transient=False)
        self._p.start()
        self._task = self._p.add_task(description, total=total, info="")

    def advance(self, n: int = 1, **info: Any) -> None:
        if self._p is None or self._task is None:  # the same test: start sets both
            return
        text = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in info.items() if v is not None)
        self._p.update(self._task, advance=n, info=text)

    def stop(self) -> None:
        if self._p is not None:
            self._p.stop()
            self._p = None


def plugin_notes() -> None:
    """What loading plugins had to tell the user (a plugin that imports fedl2p's internals), once per process."""
    from .. import plugins
    catalog = plugins.current()
    for note in catalog.notes:
        err_console.print(f"[yellow]warning:[/yellow] {escape(note)}", highlight=False)
    catalog.notes.clear()


def table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    if not console.is_terminal:
        print(tables.titled(title, columns, rows), flush=True)  # plain print: no markup, no wrapping
        return
    t = Table(title=title, title_justify="left")
    for c in columns:
        # fold, never cut: a narrow or non-terminal console (80 columns) truncated "72.10 ± 0.22" to "72.10 ±"
        t.add_column(c, justify="left" if c == columns[0] else "right", overflow="fold")
    for r in rows:
        t.add_row(*[tables.cell(v) for v in r])
    console.print(t)


def artifact_line(stage: str, aid: str, path: Any, reused: bool) -> None:
    verb = "reused" if reused else "wrote"
    # escaped: "pretrain [seen]" is not markup (rich ate the label in brackets)
    console.print(f"[green]{verb}[/green] {escape(stage)} artifact [bold]{aid}[/bold] -> {escape(str(path))}")
