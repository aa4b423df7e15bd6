from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from . import options, render

stage = options.Lazy("fedl2p_cli.stages.pfl")


def pfl_train(
    algo: str = typer.Option("pfedla", help="pfedla (per-client hypernetworks aggregate every layer over all clients; "
                             "CVPR 2022 Alg. 1) | heurpfedla (the same, the --k layers with the largest self-weight kept "
                             "local; Alg. 2) | cafeme (federated modulator gating a MAML-trained base model; SDM 2024)."),
    model: str = typer.Option("small-cnn", help="Base model (small-cnn, resnet18-cifar, ...)."),
    rounds: int = typer.Option(100, help="Communication rounds (pFedLA paper: 600 for 10 clients; CAFeMe: 1000)."),
    fraction: float = typer.Option(1.0, help="Share of the seen clients per round (pFedLA: 1.0 with 10 clients; CAFeMe: "
                                   "5 clients of 80, 0.0625)."),
    batch_size: int = typer.Option(32, help="Batch size (pFedLA: 32; CAFeMe: 30)."),
    lr: float = typer.Option(0.005, help="pFedLA: local SGD learning rate (paper: 0.005 for Fashion-MNIST). CAFeMe: the inner "
                             "step alpha (authors' code: 0.05 CIFAR-10)."),
    local_epochs: int = typer.Option(10, help="pFedLA: local epochs per round (paper: 10 with 10 clients)."),
    hn_lr: float = typer.Option(5e-3, help="pFedLA: SGD step of the hypernetworks and embeddings (authors' re-implementation "
                                "default; the paper leaves it to its supplement)."),
    embed_dim: int = typer.Option(100, help="pFedLA: client embedding size (ours, as the public re-implementation)."),
    hn_hidden: int = typer.Option(100, help="pFedLA: width of the hypernetwork's three hidden layers (ours, as the public "
                                  "re-implementation); one linear head per layer outputs a softmax over the clients."),
    k: int = typer.Option(1, help="HeurpFedLA: layers kept local (paper: 1)."),
    steps: int = typer.Option(5, help="CAFeMe: inner personalisation steps S per round (paper: 5)."),
    outer_lr: float = typer.Option(1e-3, help="CAFeMe: outer step beta (authors' code: Adam at 1e-3)."),
    order: str = typer.Option("first", help="CAFeMe inner gradients: first = no graph through the inner steps (the authors' "
                              "code) | second = differentiate through them (the paper's MAML objective; slower)."),
    outer: str = typer.Option("adam", help="CAFeMe outer step: adam = the authors' code (Adam, moments kept per client across "
                              "rounds; the paper allows any optimiser, e.g. Adam) | sgd = the plain step of Alg. 1 line 8."),
    eval_every: int = typer.Option(10, help="Rounds between validation-accuracy records in history.csv."),
    seed: int = typer.Option(0, help="Seed (init, sampling, batches)."),
    partition: Optional[str] = typer.Option(None, "--partition", help="Partition artifact id; default: the newest."),
    resume: bool = typer.Option(True, help="Continue from the last round checkpoint of an interrupted identical run."),
    force: bool = options.FORCE,
    store: Optional[Path] = options.STORE,
) -> None:
    """Train pFedLA, HeurpFedLA or CAFeMe on the seen clients -> a pfl artifact that `fedl2p personalize --methods`
    evaluates beside FT and FedL2P (pFedLA has no model for unseen clients: N/A there)."""
    cfg = stage.PFLConfig(algo=algo, model=model, rounds=rounds, fraction=fraction, batch_size=batch_size, lr=lr,
                          local_epochs=local_epochs, hn_lr=hn_lr, embed_dim=embed_dim, hn_hidden=hn_hidden, k=k,
                          steps=steps, outer_lr=outer_lr, order=order, outer=outer, eval_every=eval_every, seed=seed)
    art, reused = stage.run(cfg, options.store(store), partition, force, resume, render.RichProgress())
    render.table(f"pfl-train ({cfg.algo})", ["metric", "value"], [[k_, v] for k_, v in art.metrics.items()])
    render.artifact_line("pfl", art.id, art.path, reused)
