from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from ..stages import personalize as stage
from . import options, render


def personalize(
    unseen: bool = typer.Option(False, "--unseen", help="Evaluate the unseen pool (clients never used in meta-training)."),
    methods: str = typer.Option("ft-bnc,ft-bng,ft-bni,fedl2p", help="Comma-separated: ft-bnc (beta=1), ft-bng (beta=0), "
                                "ft-bni (batch statistics), and meta-net variants by name (fedl2p, l2p, fedl2p-fomaml, "
                                "fedl2p-bnnet, fedl2p-lrnet-b1, ...; the newest artifact of that variant)."),
    meta: Optional[List[str]] = typer.Option(None, "--meta", help="A meta-train artifact id to compare as well (repeatable)."),
    epochs: int = typer.Option(5, "--epochs", "-e", help="Fine-tuning epochs, the same budget for every method."),
    batch_size: int = typer.Option(32, help="Fine-tuning batch size (also the test batch size of BN I)."),
    base_lr: float = typer.Option(1e-3, help="Learning rate of the FT baselines."),
    seeds: str = typer.Option("0,1,2", help="Comma-separated seeds; the table reports mean ± SD over them."),
    pretrain: Optional[str] = typer.Option(None, "--pretrain", help="Pretrained-model artifact id; default: the newest."),
    stats: Optional[str] = typer.Option(None, "--stats", help="Stats artifact id; default: the newest for that model."),
    force: bool = options.FORCE,
    store: Optional[Path] = options.STORE,
) -> None:
    """Fine-tune every client of the pool under each method -> results.h5, summary.md/json, beta/eta plots."""
    cfg = stage.PersonalizeConfig(unseen, options.csv_list(methods), epochs, batch_size, base_lr, options.int_list(seeds))
    art, reused = stage.run(cfg, options.store(store), pretrain, stats, meta, force, render.RichProgress())
    show(json.loads(art.file("summary.json").read_text()))
    render.artifact_line("personalize", art.id, art.path, reused)


def show(s: dict) -> None:
    rows = [["global model", f"{100 * s['global_acc']:.2f}", "", "", ""]]
    for m, v in s["methods"].items():
        rows.append([stage.LABELS.get(m, m), f"{100 * v['mean']:.2f} ± {100 * v['sd']:.2f}",
                     f"{100 * v['vs_best_baseline']:+.2f}" if "vs_best_baseline" in v else "",
                     f"{100 * v['clients_better']:.0f}%" if "clients_better" in v else "",
                     f"{v['sparsity']:.3f}" if v.get("sparsity") is not None else ""])
    render.table(f"personalised accuracy (%), {s['pool']} clients ({s['clients']}), seeds {s['seeds']}",
                 ["method", "accuracy", "Δ vs best FT", "clients better", "sparsity"], rows)
