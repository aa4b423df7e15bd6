"""`fedl2p report`: one self-contained HTML page of one or more pipelines (or artifacts with their lineage), itself an
artifact (stage `report`): its id hashes the artifacts it shows, so the same inputs give the same report id.

What it shows, per pipeline: the lineage graph; every personalisation table (both pools side by side, each seed,
Δ against the best hand-made method and FT tuned, per domain); β and η per domain and layer; the ARI table; and per
artifact its config (what differs from the defaults, the full one collapsed), metrics, timings, `computed_on` and
every plot (embedded PNG).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import methods, plugins
from ..analysis import per_kind, spread
from ..analysis import report_html as H
from ..analysis.personalized import behind_lines, beta_table, fixed, kind_tables, roles, row_cells, spread_lines
from ..artifacts import Artifact, Draft, Store
from ..catalog import Catalog
from ..errors import ArtifactError, FedL2PError
from ..runtime import Runtime
from ..stage_table import TABLE
from .common import Missing, build_or_reuse, config_dict
from .interface import Inputs, Read, StageContext
from .rows import STATS

FORMAT = 1  # the page's layout version: part of the id, so a new layout is a new report


@dataclass
class Section:
    """One pipeline (or one artifact's lineage): its name and its artifacts, each with a label, in pipeline order."""
    name: str
    arts: list[tuple[str, Artifact]]


# -- what a report shows ---------------------------------------------------------------------------------------
def from_pipeline(path: Path, store_override: Path | None, runtime: Runtime | None = None) -> tuple[Section, Store]:
    """A pipeline's artifacts: those its last run made in the store (read without its plugins), else those its plan
    names, as `fedl2p run` would reuse them; refused (one line) where one is missing."""
    from . import pipeline
    p = pipeline.load(path, store_override)
    steps = pipeline.recorded(p)
    if steps is None:
        rt = (runtime or Runtime()).replace(reuse_only=True)
        rt = rt.replace(allow_import=(*rt.allow_import, *pipeline.named_modules(p)))  # the models the file names
        if p.plugins:  # compiling needs the file's plugins: a catalog of its own, the one handed over stays as it was
            handed = plugins.of(rt)
            own = plugins.build(*handed.active(), *p.plugins, installed=True).allowing(handed.allowed)
            rt = rt.replace(catalog=own)
        try:  # every step finds its artifact, or names the one missing; nothing is built
            with plugins.using(plugins.of(rt)):
                results = pipeline.run(p, None, _no_progress, runtime=rt)
        except Missing as e:
            raise FedL2PError(f"pipeline {path} has no {e.stage} artifact {e.id} in {p.store.root} yet; run `fedl2p "
                              f"run {path}` first (or pass --store)") from None
        steps = [(r.stage, r.label, r.artifact.id) for r in results]
    arts, seen = [], set()
    for stage, lab, aid in steps:
        if aid not in seen:
            seen.add(aid)
            arts.append((lab, p.store.load(stage, aid)))
    return Section(p.name, arts), p.store


def _no_progress():
    from .common import NoProgress
    return NoProgress()


def find(store: Store, ref: str) -> Artifact:
    """The artifact of any stage whose id starts with `ref`."""
    hits = [(s, i) for s in TABLE.names for i in store.ids(s) if i.startswith(ref)]
    if not hits:
        raise ArtifactError(f"no artifact with id '{ref}' in {store.root} (see `fedl2p artifacts list`)")
    if len(hits) > 1:
        raise ArtifactError(f"id prefix '{ref}' is ambiguous: {', '.join(f'{s}/{i}' for s, i in hits)}")
    return store.load(*hits[0])  # a report reads files: the plugins that made them need not be here


def lineage(store: Store, art: Artifact) -> list[Artifact]:
    """`art` and every artifact it was made from (parents, and a partition's excluded one), oldest stage first."""
    out: dict[str, Artifact] = {}
    todo = [art]
    while todo:
        a = todo.pop()
        if a.id in out:
            continue
        out[a.id] = a
        todo += [store.load(k.split(":")[0], v) for k, v in a.parents.items()]
        if a.stage == "partition" and a.config.get("exclude"):  # the partition whose images it left out
            todo.append(store.load(a.stage, a.config["exclude"]))
    return sorted(out.values(), key=lambda a: (TABLE.names.index(a.stage), a.age))


def from_artifact(store: Store, ref: str) -> Section:
    art = find(store, ref)
    return Section(f"{art.stage} {art.id}", [(label(a), a) for a in lineage(store, art)])


def label(a: Artifact) -> str:
    """A short name of what an artifact is, where the stage alone does not say."""
    where = TABLE.stage(a.stage).label
    return (a.config if where[0] == "config" else a.metrics).get(where[1]) or a.stage if where else a.stage


# -- the artifact ----------------------------------------------------------------------------------------------
def identity(sections: list[Section]) -> tuple[dict, dict[str, str]]:
    """Config and parents of the report: which artifacts, grouped by pipeline, in order."""
    config = {"format": FORMAT, "sections": [{"name": s.name, "artifacts": [[lab, a.stage, a.id] for lab, a in s.arts]}
                                             for s in sections]}
    parents = {f"{a.stage}:{a.id}": a.id for s in sections for _, a in s.arts}
    return config, parents


def execute(sections: list[Section], inputs: Inputs, ctx: StageContext) -> tuple[Artifact, bool]:
    """One HTML page of `sections` (what it shows: the artifacts themselves, so it reads no inputs) -> report.html."""
    store = ctx.store
    if not sections:
        raise FedL2PError("report: name at least one pipeline file or artifact id")
    for s in sections:
        for _, a in s.arts:
            if a.path.parent.parent.resolve() != store.root.resolve():
                raise FedL2PError(f"report: {s.name}'s artifacts live in {a.path.parent.parent}, not in {store.root}; "
                                  "give the pipelines one store (--store)")
    config, parents = identity(sections)

    def build(draft: Draft) -> None:
        draft.path("report.html").write_text(render(sections, store, ctx.catalog), encoding="utf-8")
        draft.metrics = {"sections": [s.name for s in sections], "artifacts": len(parents)}
        draft.plugins = []  # a page: opening it again needs none of the plugins its artifacts were made with

    return build_or_reuse(store, "report", config, parents, build, ctx.force, ctx.runtime)


# -- the page --------------------------------------------------------------------------------------------------
def render(sections: list[Section], store: Store, catalog: Catalog) -> str:
    """The page; `catalog` (the stage's) names the methods and reads the artifacts."""
    from .. import __version__
    body, nav, done = [], [], set()
    for k, s in enumerate(sections):
        anchor = f"sec-{k}"
        nav.append((anchor, s.name))
        body.append(f'<h2 id="{anchor}">{H.esc(s.name)}</h2>' + section_html(s, store, catalog))
    body.append('<h2 id="artifacts">Artifacts</h2><p class="meta">Each artifact once (a pipeline that reuses '
                "another's shares its box): config as it differs from the defaults (full config collapsed), "
                "headline metrics, timing, where it was computed, and its plots.</p>")
    nav.append(("artifacts", "Artifacts"))
    for s in sections:
        for lab, a in s.arts:
            if a.id not in done:
                done.add(a.id)
                body.append(artifact_html(lab, a))
    names = ", ".join(s.name for s in sections)
    return H.page(f"fedl2p report: {names}", f"fedl2p {__version__}; store {store.root}; "
                  f"{len(done)} artifacts", nav, "".join(body))


def section_html(s: Section, store: Store, catalog: Catalog) -> str:
    arts = [a for _, a in s.arts]
    nodes = [H.Node(a.id, a.stage, lab) for lab, a in s.arts]
    ids = {a.id for a in arts}
    edges = [(v, a.id) for a in arts for v in a.parents.values() if v in ids]
    dashed = [(a.config["exclude"], a.id) for a in arts if a.stage == "partition" and a.config.get("exclude") in ids]
    out = ["<h3>Lineage</h3>", H.lineage_svg(nodes, edges, dashed),
           '<p class="meta">An arrow runs from each artifact to those made from it; dashed: a partition whose clients '
           "hold none of the other's images. Click a box for its artifact.</p>"]
    pers = [a for a in arts if a.stage == "personalize"]
    if pers:
        out.append(pools_html(pers, catalog))
    for a in arts:
        if a.stage == "analyze" and "ari.json" in a.manifest["files"]:
            ari = json.loads(a.file("ari.json").read_text())
            out.append(H.table(["feature", "ARI"], [[k, f"{v:.3f}"] for k, v in ari["ari"].items()],
                               f"ARI of spectral clusterings vs the true domains ({ari['pool']} clients; β and η of "
                               f"{methods.label(ari['method'], catalog) if ari.get('method') else '—'})"))
        elif a.stage == "analyze" and "summary.md" in a.manifest["files"]:
            out.append(f"<h4>analyze {H.esc(a.config.get('analysis'))}</h4><pre>"
                       f"{H.esc(a.file('summary.md').read_text())}</pre>")
    for a in pers:
        out.append(pool_detail_html(store, a, catalog))
    metas = [a for a in arts if TABLE.stage(a.stage).trains]
    if metas:
        out.append(training_html(metas))
    return "".join(out)


def pools_html(pers: list[Artifact], catalog: Catalog) -> str:
    """Every method's accuracy in each pool, side by side (mean ± SD over seeds; Δ vs best FT / FT tuned)."""
    sums = [json.loads(a.file("summary.json").read_text()) for a in pers]
    names = list(dict.fromkeys(m for s in sums for m in s["methods"]))
    cols = ["method"]
    for s in sums:
        cols += [f"{s['pool']} ({s['clients']} clients)", "Δ vs best FT", "Δ vs FT tuned"]
    rows = [["global model"] + sum([[f"{100 * s['global_acc']:.2f}", "", ""] for s in sums], [])]
    for m in names:
        row = [methods.label(m, catalog)]
        for s in sums:
            v = s["methods"].get(m)
            row += row_cells(m, v, catalog)[1:4] if v else ["—", "", ""]
        rows.append(row)
    seeds = sorted({x for s in sums for x in s["seeds"]})
    return H.table(cols, rows, f"Personalised test accuracy (%), mean ± SD over seeds {seeds}; Δ in points, paired per "
                   "client and seed")


def pool_detail_html(store: Store, a: Artifact, catalog: Catalog) -> str:
    """One pool: each seed's accuracy, the paired deltas, per domain; β and η of each learned method per domain."""
    from ..io import results_h5
    s = json.loads(a.file("summary.json").read_text())
    r = results_h5.read(a.file("results.h5"))
    seeds = [f"seed {x}" for x in r.seeds]
    rows = [["global model", *[""] * len(seeds), f"{100 * s['global_acc']:.2f}", "", "", "", ""]]
    for i, m in enumerate(r.methods):
        per = [np.nan if np.isnan(r.acc_after[i, k]).all() else float(np.nanmean(r.acc_after[i, k])) for k in range(len(r.seeds))]
        cells = row_cells(m, s["methods"][m], catalog)
        rows.append([cells[0], *[f"{100 * v:.2f}" if not np.isnan(v) else "N/A" for v in per], *cells[1:]])
    out = [f'<h3 id="pool-{H.esc(a.id)}">{H.esc(s["pool"])} clients ({s["clients"]})</h3>',
           H.table(["method", *seeds, "mean ± SD", "Δ vs best FT", "Δ vs FT tuned", "clients better", "sparsity"], rows,
                   f"Personalised test accuracy (%), {s['pool']} clients; best hand-made method: "
                   f"{methods.label(s['best_baseline'], catalog) if s.get('best_baseline') else '—'}")]
    doms = list(dict.fromkeys(d for v in s["methods"].values() for d in v["per_domain"]))
    side = [H.table(["method", *doms], [[methods.label(m, catalog), *[f"{100 * v['per_domain'][d]:.2f}" if d in v["per_domain"]
                                                              else "—" for d in doms]] for m, v in s["methods"].items()],
                    f"Accuracy (%) per domain, {s['pool']} clients")]
    names = Read(a, store, catalog, plugins=False).parent(STATS).value.param_names  # its statistics' tensors, by the stats reader
    for m, v in s["methods"].items():
        if "beta_per_domain" in v:
            title, cols, brows = beta_table(m, v["beta_per_domain"], catalog)
            side.append(H.table(cols, brows, f"{title}, {s['pool']} clients"))
        eta = r.eta.get(m)
        if eta is not None and isinstance(methods.find(m, catalog), methods.Learned) and not np.isnan(eta).all():
            side.append(eta_table(methods.label(m, catalog), eta, r.domain, doms, names))
    out.append(H.row(side))
    # the per-kind tables, recomputed from results.h5 for a summary written before it had them
    pk = s.get("per_kind") or per_kind.table(r.methods, r.acc_after, r.domain,
                                             dict(zip(map(int, np.unique(r.domain)), doms)), roles(r.methods, catalog))
    out.append(H.row([H.table(cols, krows, f"{title}, {s['pool']} clients") for title, cols, krows in kind_tables(pk, catalog)]))
    if behind := behind_lines(pk, catalog):
        out.append("<ul>" + "".join(f"<li>{H.esc(x)}</li>" for x in behind) + "</ul>")
    spreads = spread_lines(s, catalog) if any("spread" in v for v in s["methods"].values()) else []  # recomputed for old
    spreads = spreads or [line for m in r.methods if not fixed(m, catalog) and not np.isnan(r.eta[m]).all()
                          for line in spread.lines(methods.label(m, catalog), spread.spread(r.beta[m], r.eta[m], r.domain))]
    if spreads:
        out.append("<p>Are the strategies personal?</p><ul>" + "".join(f"<li>{H.esc(x)}</li>" for x in spreads) + "</ul>")
    return "".join(out)


def eta_table(label: str, eta: np.ndarray, domain: np.ndarray, doms: list[str], names: list[str]) -> str:
    """Learned LR per parameter tensor (rows) and domain (columns), mean over a domain's clients (`label`: the row's)."""
    ids = list(np.unique(domain))
    cols = doms if len(doms) == len(ids) else [str(d) for d in ids]
    rows = [[name, *[f"{float(np.nanmean(eta[domain == d, p])):.3g}" for d in ids]] for p, name in enumerate(names)]
    return H.table(["tensor", *cols], rows, f"η per tensor and domain, {label}")


def training_html(arts: list[Artifact]) -> str:
    rows = []
    for a in arts:
        m = a.metrics
        if a.stage == "meta-train":
            what = (f"val loss {_f(m.get('first_val_loss'))} → best {_f(m.get('best_val_loss'))} (round "
                    f"{m.get('best_round')}) of {m.get('rounds_run')} rounds"
                    + (f"; diverged: {m['diverged']}" if m.get("diverged") else ""))
        else:
            what = "; ".join(f"{k} {_f(v)}" for k, v in m.items())
        rows.append([a.stage, label(a), a.id, what, timing(a)])
    return H.table(["stage", "what", "id", "result", "time"], rows, "Training")


def _f(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else "—" if v is None else str(v)


def timing(a: Artifact) -> str:
    """The build's wall time (manifests since it is recorded), else the rounds' own time from history.csv."""
    if "build_s" in a.manifest:
        return f"{a.manifest['build_s']:.1f} s"
    if "history.csv" in a.manifest["files"]:
        with open(a.file("history.csv"), newline="") as f:
            rounds = [float(r["round_s"]) for r in csv.DictReader(f) if r.get("round_s")]
        if rounds:
            return f"{sum(rounds):.1f} s ({len(rounds)} rounds)"
    return "—"


def config_diff(a: Artifact) -> list[list[str]]:
    """Config keys whose value differs from the stage's default (keys the defaults lack: derived, shown too)."""
    cls = TABLE.stage(a.stage).config_type(a.config)
    defaults = _flat(config_dict(cls())) if cls else {}
    return [[k, _show(v), _show(defaults[k]) if k in defaults else "(derived)"]
            for k, v in _flat(a.config).items() if k not in defaults or defaults[k] != v]


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v and all(isinstance(x, str) for x in v) and k in ("meta",):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def _show(v: Any) -> str:
    return json.dumps(v, default=str) if not isinstance(v, str) else v


def artifact_html(lab: str, a: Artifact) -> str:
    m = a.manifest
    head = (f'<div class="art" id="art-{H.esc(a.id)}"><h3>{H.esc(a.stage)} · {H.esc(lab)} · <span class="mono">'
            f'{H.esc(a.id)}</span></h3><p class="meta">created {H.esc(m.get("created"))}; time {H.esc(timing(a))}; '
            f'computed on {H.esc(_computed(m.get("computed_on")))}; fedl2p {H.esc(m.get("package_version"))}'
            + (f"; tracked as {H.esc(m['tracking'].get('run'))} ({H.esc(m['tracking'].get('backend'))}, "
               f"{H.esc(m['tracking'].get('uri'))})" if m.get("tracking") else "") + "</p>")
    diff = config_diff(a) if a.stage != "report" else []
    parts = [head]
    parts.append(H.table(["setting", "value", "default"], diff, "Config (what differs from the defaults)") if diff
                 else '<p class="meta">Config: every setting at its default.</p>')
    parts.append(H.details("full config and parents", H.pre_json({"config": a.config, "parents": a.parents})))
    metrics = {k: v for k, v in a.metrics.items() if not isinstance(v, (dict, list))}
    if metrics:
        parts.append(H.table(["metric", "value"], [[k, _f(v)] for k, v in metrics.items()], "Metrics"))
    parts.append(H.details("files (sha256)", H.table(["file", "sha256"], [[f, d[:16] + "…"] for f, d in m["files"].items()])))
    parts += [H.figure(f, a.file(f).read_bytes()) for f in sorted(m["files"]) if f.endswith(".png")]
    return "".join(parts) + "</div>"


def _computed(c: Any) -> str:
    if isinstance(c, dict):
        return ", ".join(f"{k} {v}" for k, v in c.items() if not isinstance(v, (dict, list)))
    return "—" if c is None else str(c)
