"""The HTML of `fedl2p report`: one self-contained page (inline CSS and SVG, images as data URIs), no I/O here.

The page must open offline and print: nothing is fetched (no CDN, no web font), the lineage graph is SVG drawn
here, and the one inline script only opens every collapsed section before printing.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..stage_table import TABLE

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1b1f24;margin:0 auto;max-width:1200px;
padding:16px 24px}
h1{font-size:24px;margin:8px 0}h2{font-size:20px;border-bottom:2px solid #d0d7de;padding-bottom:4px;margin-top:32px}
h3{font-size:16px;margin:20px 0 6px}h4{font-size:14px;margin:14px 0 4px}
table{border-collapse:collapse;margin:6px 0 12px;font-variant-numeric:tabular-nums}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:right;vertical-align:top}
th{background:#f3f5f7}td:first-child,th:first-child{text-align:left}
.tbl{margin:6px 0 12px}.cap{font-weight:600;margin:4px 0}.tbl table{margin:0}
.row{display:flex;flex-wrap:wrap;gap:6px 28px;align-items:flex-start}.lineage{max-width:100%;height:auto}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
pre{background:#f6f8fa;padding:8px;overflow:auto;font-size:12px;max-height:420px}
.meta{color:#57606a}.good{color:#1a7f37}.bad{color:#cf222e}
figure{display:inline-block;margin:6px 12px 6px 0;vertical-align:top}figure img{max-width:560px;border:1px solid #d0d7de}
figcaption{font-size:12px;color:#57606a}
.art{border:1px solid #d0d7de;border-radius:6px;padding:4px 14px 10px;margin:14px 0}
svg a:hover rect{stroke-width:2.5}
nav a{margin-right:12px}
@media print{body{max-width:none;padding:0;font-size:11px}nav{display:none}pre{max-height:none;white-space:pre-wrap}
.art,figure,table,svg{break-inside:avoid}h2{break-before:auto;break-after:avoid}figure img{max-width:45vw}
a{color:inherit;text-decoration:none}}
"""
# closed <details> do not print: open them all first (the page works without it)
SCRIPT = "addEventListener('beforeprint',()=>document.querySelectorAll('details').forEach(d=>d.open=true))"


def esc(v: Any) -> str:
    return html.escape(str(v), quote=True)


def table(columns: list[str], rows: Iterable[list[Any]], caption: str | None = None, cls: str = "") -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in r) + "</tr>" for r in rows)
    cap = f'<p class="cap">{esc(caption)}</p>' if caption else ""  # a <caption> would wrap to the table's width
    return f'<div class="tbl">{cap}<table class="{esc(cls)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def row(parts: Iterable[str]) -> str:
    """Small tables side by side (wrapping on a narrow page)."""
    return f'<div class="row">{"".join(parts)}</div>'


def figure(name: str, png: bytes) -> str:
    data = base64.b64encode(png).decode()
    return f'<figure><img alt="{esc(name)}" src="data:image/png;base64,{data}"><figcaption>{esc(name)}</figcaption></figure>'


def details(summary: str, inner: str, open_: bool = False) -> str:
    return f"<details{' open' if open_ else ''}><summary>{esc(summary)}</summary>{inner}</details>"


def pre_json(obj: Any) -> str:
    return f"<pre>{esc(json.dumps(obj, indent=2, default=str))}</pre>"


@dataclass
class Node:
    """One artifact in the lineage graph: its stage (the column), a label and its id (the anchor it links to)."""
    id: str
    stage: str
    label: str


BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 160, 42, 44, 14, 8


def _colour(stage: str) -> str:
    return next((s.colour for s in TABLE.rows if s.name == stage), "#fff")


def _short(text: str, n: int = 22) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def lineage_svg(nodes: list[Node], edges: list[tuple[str, str]], dashed: Iterable[tuple[str, str]] = ()) -> str:
    """Artifacts in columns by stage, an arrow from each parent to its child (dashed: a partition that excludes
    another's images). Every box links to its artifact's section (#art-<id>)."""
    cols = [c for c in TABLE.sections if any(n.stage == c for n in nodes)]  # a column per stage, in pipeline order
    cols += sorted({n.stage for n in nodes} - set(cols))
    pos: dict[str, tuple[float, float]] = {}
    for ci, c in enumerate(cols):
        for ri, n in enumerate(n for n in nodes if n.stage == c):
            pos[n.id] = (PAD + ci * (BOX_W + GAP_X), PAD + 18 + ri * (BOX_H + GAP_Y))
    width = PAD * 2 + len(cols) * BOX_W + max(0, len(cols) - 1) * GAP_X
    height = max(y for _, y in pos.values()) + BOX_H + PAD if pos else 40
    out = [f'<svg class="lineage" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           'role="img" aria-label="artifact lineage" font-family="system-ui,sans-serif">',
           '<defs><marker id="arr" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" fill="#57606a"/></marker></defs>']
    out += [f'<text x="{PAD + i * (BOX_W + GAP_X)}" y="{PAD + 8}" font-size="11" fill="#57606a">{esc(c)}</text>'
            for i, c in enumerate(cols)]
    for style, pairs in (("", edges), (' stroke-dasharray="4 3"', dashed)):
        for a, b in pairs:
            if a in pos and b in pos:
                out.append(_edge(pos[a], pos[b], style))
    for n in nodes:
        x, y = pos[n.id]
        out.append(f'<a href="#art-{esc(n.id)}"><title>{esc(n.stage)} {esc(n.label)} {esc(n.id)}</title>'
                   f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="5" fill="{_colour(n.stage)}" '
                   f'stroke="#57606a"/><text x="{x + 8}" y="{y + 17}" font-size="12" font-weight="600">'
                   f'{esc(_short(n.label))}</text><text x="{x + 8}" y="{y + 33}" font-size="11" '
                   f'font-family="ui-monospace,monospace" fill="#57606a">{esc(n.id)}</text></a>')
    return "".join(out) + "</svg>"


def _edge(a: tuple[float, float], b: tuple[float, float], style: str) -> str:
    (x1, y1), (x2, y2) = (a[0] + BOX_W, a[1] + BOX_H / 2), (b[0], b[1] + BOX_H / 2)
    if x2 <= x1:  # same column (or a later one drawn left): loop around the left side
        x1, x2 = a[0], b[0]
        return (f'<path d="M{x1},{y1} C{x1 - 30},{y1} {x2 - 30},{y2} {x2},{y2}" fill="none" stroke="#57606a"{style} '
                'marker-end="url(#arr)"/>')
    mid = (x1 + x2) / 2
    return (f'<path d="M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}" fill="none" stroke="#57606a"{style} '
            'marker-end="url(#arr)"/>')


def page(title: str, subtitle: str, nav: list[tuple[str, str]], body: str) -> str:
    links = "".join(f'<a href="#{esc(a)}">{esc(t)}</a>' for a, t in nav)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width,initial-scale=1"><title>{esc(title)}</title><style>{CSS}</style>'
            f"<script>{SCRIPT}</script></head><body><h1>{esc(title)}</h1><p class=\"meta\">{esc(subtitle)}</p>"
            f"<nav>{links}</nav>{body}</body></html>\n")
