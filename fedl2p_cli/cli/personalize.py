from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from . import options, render

stage = options.Lazy("fedl2p_cli.stages.personalize")


def personalize(
    unseen: bool = typer.Option(False, "--unseen", help="Evaluate the unseen pool (clients never used in meta-training)."),
    methods: str = typer.Option("ft-bnc,ft-bng,ft-bni,fedl2p", help="Comma-separated: ft-bnc (beta=1), ft-bng (beta=0), "
                                "ft-bni (batch statistics), ft-tuned (each client picks the best of {BN C, BN G, BN I} x "
                                "{LR/10, LR, LR x10} and no fine-tuning on its own validation split; not in the paper, a "
                                "stronger baseline), and meta-net variants by name (fedl2p, l2p, fedl2p-fomaml, "
                                "fedl2p-bnnet, fedl2p-lrnet-b1, ...; the newest artifact of that variant), and the other personalised-FL "
                                "systems pfedla, heurpfedla, cafeme (the newest `fedl2p pfl-train` artifact on this partition)."),
    meta: Optional[List[str]] = typer.Option(None, "--meta", help="A meta-train artifact id to compare as well (repeatable)."),
    pfl: Optional[List[str]] = typer.Option(None, "--pfl", help="A pfl-train artifact id (pFedLA, HeurpFedLA, CAFeMe) to "
                                            "compare as well (repeatable)."),
    pfl_steps: int = typer.Option(50, help="CAFeMe: personalisation steps (Alg. 2) of every evaluated client before "
                                  "testing (paper: 50). pFedLA/HeurpFedLA are evaluated as trained (their Alg. 1 output) "
                                  "and have no model for unseen clients (N/A)."),
    epochs: int = typer.Option(5, "--epochs", "-e", help="Fine-tuning epochs, the same budget for every method."),
    batch_size: int = typer.Option(32, help="Fine-tuning batch size (also the test batch size of BN I)."),
    base_lr: float = typer.Option(1e-3, help="Learning rate of the FT baselines."),
    seeds: str = typer.Option("0,1,2", help="Comma-separated seeds; the table reports mean ± SD over them."),
    client_bn: str = typer.Option("precise", help="Client BN statistics used at test time by every method that mixes them "
                                  "(BN C, FedL2P's beta): precise = recomputed after fine-tuning by one no-grad pass over the "
                                  "client's train data under the same beta (PreciseBN; consistent, not in the paper) | running "
                                  "= the paper's momentum-0.1 running statistics (started from stats.h5; stale for layers >= 2)."),
    eval_stats: str = typer.Option("running", help="Test-time statistics of the learned methods (FedL2P and its "
                                   "ablations): running = beta mixes the client's statistics with the pretrained ones "
                                   "(the paper's inference) | test-batch = beta mixes each test batch's statistics, as in "
                                   "training (not in the paper: gives a learned beta the transductive access to test "
                                   "batches that FT (BN I) has; with beta 1 it is BN I's evaluation). Its methods are "
                                   "named with a '-tbs' suffix. The FT baselines are unaffected."),
    pretrain: Optional[str] = typer.Option(None, "--pretrain", help="Pretrained-model artifact id; default: the newest."),
    stats: Optional[str] = typer.Option(None, "--stats", help="Stats artifact id; default: the newest for that model."),
    force: bool = options.FORCE,
    store: Optional[Path] = options.STORE,
) -> None:
    """Fine-tune every client of the pool under each method -> results.h5, summary.md/json, beta/eta plots."""
    cfg = stage.PersonalizeConfig(unseen=unseen, methods=options.csv_list(methods), epochs=epochs, batch_size=batch_size,
                                  base_lr=base_lr, seeds=options.int_list(seeds), client_bn=client_bn,
                                  pfl_steps=pfl_steps, eval_stats=eval_stats)
    art, reused = stage.run(cfg, options.store(store), pretrain, stats, meta, force, render.RichProgress(), pfl)
    show(json.loads(art.file("summary.json").read_text()))
    render.artifact_line("personalize", art.id, art.path, reused)


def show(s: dict) -> None:
    rows = [["global model", f"{100 * s['global_acc']:.2f}", "", "", "", ""]]
    rows += [stage.row_cells(m, v) for m, v in s["methods"].items()]
    render.table(f"personalised accuracy (%), {s['pool']} clients ({s['clients']}), seeds {s['seeds']}",
                 ["method", "accuracy", "Δ vs best FT", "Δ vs FT tuned", "clients better", "sparsity"], rows)
