from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from . import options, render

stage = options.Lazy("fedl2p_cli.stages.pretrain")


def pretrain(
    algo: str = typer.Option("fedavg", help="fedavg | fedbabu (head frozen while training) | perfedavg-hf (Per-FedAvg, Hessian-free MAML steps)."),
    model: str = typer.Option("small-cnn", help="small-cnn | resnet18-cifar | resnet18 (ImageNet layout) | resnet18-speech (1-channel log-mel spectrograms)."),
    rounds: int = typer.Option(30, help="Communication rounds."),
    fraction: float = typer.Option(0.1, help="Share r of the seen clients sampled per round."),
    local_epochs: int = typer.Option(1, help="Local epochs per round."),
    batch_size: int = typer.Option(32, help="Batch size."),
    lr: float = typer.Option(0.1, help="SGD learning rate (x0.1 at 50% and 75% of the rounds); Per-FedAvg's outer step beta."),
    pf_alpha: float = typer.Option(0.01, help="Per-FedAvg (HF) inner step size alpha."),
    eval_every: int = typer.Option(5, help="Evaluate the global model on the seen and unseen clients' test data every k rounds."),
    seed: int = typer.Option(0, help="Seed (model init, client sampling, batches)."),
    init: Optional[Path] = typer.Option(None, help="Import a state dict (safetensors or torch.save) instead of training."),
    reset_head: bool = typer.Option(False, help="With --init: start a new classifier when the class count differs."),
    workers: int = typer.Option(1, help="Processes that run a round's clients in parallel, one torch thread each; the "
                                "artifact is the same as with 1 (bit for bit; not part of its id)."),
    engine: str = typer.Option("local", help="Where the round's client updates run: local = this process (or --workers "
                               "processes) | flower = Flower ClientApps in Flower's simulation runtime (Message API; --workers "
                               "at a time; needs pip install 'fedl2p[flower]'). The same artifact either way (bit for bit; "
                               "not part of its id)."),
    gpus_per_client: float = typer.Option(0.0, help="With --engine flower on a GPU: the share of a GPU each ClientApp "
                                          "gets (0.25 runs four ClientApps per GPU, on every GPU Ray sees). Not part of "
                                          "the artifact's id."),
    round_timeout: float = options.ROUND_TIMEOUT,
    min_answers: float = options.MIN_ANSWERS,
    round_retries: int = options.ROUND_RETRIES,
    partition: Optional[str] = typer.Option(None, "--from", help="Partition artifact id (prefix); default: the newest."),
    resume: bool = typer.Option(True, help="Continue from the last round checkpoint of an interrupted identical run."),
    force: bool = options.FORCE,
    store: Optional[Path] = options.STORE,
) -> None:
    """Pretrain the global model federatedly on the seen clients -> model.safetensors, history.csv, curves.png."""
    cfg = stage.PretrainConfig(algo=algo, model=model, rounds=rounds, fraction=fraction, local_epochs=local_epochs,
                               batch_size=batch_size, lr=lr, pf_alpha=pf_alpha, eval_every=eval_every, seed=seed,
                               init=str(init) if init else None, reset_head=reset_head, workers=workers, engine=engine,
                               gpus_per_client=gpus_per_client, round_timeout=round_timeout, min_answers=min_answers,
                               round_retries=round_retries)
    art, reused = stage.run(cfg, options.store(store), partition, force, resume, render.RichProgress())
    if art.metrics:
        render.table("global model", ["metric", "value"], [[k, v] for k, v in art.metrics.items()])
    render.artifact_line("pretrain", art.id, art.path, reused)
