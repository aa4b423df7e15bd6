"""Markdown tables, written one way: the CLI's tables in a log and every bench report use these.

Pure formatting (no terminal, no I/O): a row is "| a | b |", the rule under the header "|---|---|"."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def row(cells: Iterable[Any]) -> str:
    """One table line; each cell as str() gives it (a report formats its numbers itself)."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def rule(n: int) -> str:
    """The line under a header of n columns."""
    return "|" + "---|" * n


def lines(columns: Sequence[Any], rows: Iterable[Iterable[Any]]) -> list[str]:
    """Header, rule and rows."""
    return [row(columns), rule(len(columns)), *(row(r) for r in rows)]


def markdown(columns: Sequence[Any], rows: Iterable[Iterable[Any]]) -> str:
    """The table as text, without a trailing newline."""
    return "\n".join(lines(columns, rows))


def cell(v: Any) -> str:
    """A value as a table shows it: a float to 4 significant digits."""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def escaped(v: Any) -> str:
    """A cell that cannot break its table: its own "|" escaped, on one line."""
    return cell(v).replace("|", "\\|").replace("\n", " ")


def titled(title: str, columns: Sequence[Any], rows: Iterable[Iterable[Any]]) -> str:
    """A titled GitHub-style table of any values (each through `escaped`): full width, one line per row."""
    body = markdown([escaped(c) for c in columns], ([escaped(v) for v in r] for r in rows))
    return f"{title}\n\n{body}\n"
