"""`fedl2p analyze clusters`: ARI of spectral clusterings and distance maps of xi, x, beta and eta."""

from __future__ import annotations

import json

import numpy as np

from ..analysis import spread
from ..analysis.clusters import distance_map, spectral_ari
from ..artifacts import Artifact, Draft
from ..configs import ClustersConfig
from ..core.config import validate
from ..errors import FedL2PError
from .common import build_or_reuse
from .interface import Inputs, Planned, SectionFile, StageContext
from .rows import PARTITION, PERSONALIZE, STATS


def features(stats_table, results, method: str | None, metas: list[str]) -> tuple[dict[str, np.ndarray], np.ndarray, str | None]:
    """Rows = clients of the personalize pool: xi, x (inputs) and beta, eta (outputs of the chosen method, one of the
    learned rows `metas`)."""
    clients = results.client
    rows = np.array([stats_table.row(int(c)) for c in clients])
    feats = {"xi": stats_table.xi.numpy()[rows], "x": stats_table.x.numpy()[rows]}
    if method is not None and method not in metas:
        raise FedL2PError(f"method '{method}' has no learned beta/eta in this personalize artifact (has: {', '.join(metas) or 'none'})")
    method = method or (metas[0] if metas else None)
    if method is not None:
        ok = ~np.isnan(results.eta[method]).any(axis=1)
        if ok.all():
            feats |= {"beta": results.beta[method], "eta": results.eta[method]}
    return feats, results.domain, method


def markdown(table: dict, names: list[str], method: str | None) -> str:
    lines = [f"Adjusted Rand Index of spectral clusterings vs true domains ({', '.join(names)}); outputs of {method}", "",
             "| feature | ARI |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def spread_md(method: str | None, sp: dict, round0: dict | None = None) -> str:
    """The spread of the method's β and LRs beside its round-0 control: an ARI says whether the clusters follow the
    domains, not how far apart the strategies are, nor whether training made them so."""
    if method is None or not sp:
        return ""
    return "\n" + "\n".join(f"- {line}" for line in spread.lines(method, sp, round0)) + "\n"


def round0_of(pers_art: Artifact, method: str | None) -> dict | None:
    """The round-0 control personalize recorded for the method (None: none recorded, e.g. an older artifact)."""
    if method is None or "summary.json" not in pers_art.manifest["files"]:
        return None
    return json.loads(pers_art.file("summary.json").read_text())["methods"].get(method, {}).get("spread_round0")


def execute(cfg: ClustersConfig, inputs: Inputs, ctx: StageContext) -> tuple[Artifact, bool]:
    """The stage interface (`fedl2p analyze clusters`, a pipeline's [analyze]): the `personalize` run it analyses
    among the inputs (default: the newest)."""
    validate(cfg)
    pers = inputs.get(PERSONALIZE)
    stats_in = pers.parent(STATS)
    part_in = stats_in.parent(PARTITION)
    pers_art, results, metas = pers.artifact, pers.value.results, pers.value.learned
    stats_art, table, part_art, part = stats_in.artifact, stats_in.value, part_in.artifact, part_in.value
    if len(np.unique(results.domain)) < 2:
        raise FedL2PError(f"partition {part_art.id} has a single domain among these clients; clustering by domain needs two or more "
                          "(use a feature-shift partition, e.g. --dataset fmnist-c; a speaker partition has one client per speaker)")
    features(table, results, cfg.method, metas)  # an unknown --method fails here, before anything is written
    parents = {"personalize": pers_art.id, "stats": stats_art.id}

    def build(draft: Draft) -> None:
        from ..analysis.plots import plot_distance_map
        feats, domains, method = features(table, results, cfg.method, metas)
        names = [part.domain_names[d] for d in np.unique(domains)]
        ari = {}
        for name, f in feats.items():
            ari[name], _ = spectral_ari(f.astype(np.float64), domains, cfg.seed)
            m = distance_map(f.astype(np.float64), domains)
            np.savetxt(draft.path(f"distance_map_{name}.csv"), m, delimiter=",", header=",".join(names), fmt="%.6f")
            plot_distance_map(m, names, f"relative cluster distances of {name} (log scale)", draft.path(f"distance_map_{name}.png"))
        sp = spread.spread(results.beta[method], results.eta[method], domains) if method is not None else {}
        r0 = round0_of(pers_art, method)
        draft.path("ari.json").write_text(json.dumps({"method": method, "pool": results.pool, "ari": ari, "spread": sp,
                                                      "spread_round0": r0}, indent=2))
        draft.path("ari.md").write_text(markdown(ari, names, method) + spread_md(method, sp, r0))
        draft.metrics = {f"ari_{k}": v for k, v in ari.items()} | {"method": method}

    return build_or_reuse(ctx.store, "analyze", {"analysis": "clusters", **cfg.__dict__}, parents, build, ctx.force,
                          ctx.runtime)


def plan(file: SectionFile) -> list[Planned]:
    """[analyze]: the clusters of one personalised pool (`pool`, default the last of [personalize]'s pools); checked
    even where the file personalises no pool for it to analyse."""
    if "analyze" not in file.sections:
        return []
    values = file.table("analyze")
    pool = values.pop("pool", None)
    cfg = file.config(ClustersConfig, "analyze", values, also=("pool",))
    if "personalize" not in file.sections:
        return []
    pools = file.table("personalize").get("pools", ["seen"])  # checked by personalize's plan, which ran before
    pool = pools[-1] if pool is None else pool
    if pool not in pools:
        return []
    return [Planned(f"analyze:{pool}", f"clusters ({pool})", "analyze", cfg, {"personalize": (f"personalize:{pool}",)})]
