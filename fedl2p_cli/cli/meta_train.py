from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from . import options, render

stage = options.Lazy("fedl2p_cli.stages.meta_train")


def meta_train(
    rounds: int = typer.Option(30, help="Communication rounds (paper: up to 500)."),
    fraction: float = typer.Option(0.1, help="Share r of the seen clients sampled per round."),
    iterations: int = typer.Option(3, "--iterations", "-k", help="K: meta-iterations per client per round (the authors' "
                                   "CIFAR-10 config: 3)."),
    epochs: int = typer.Option(5, "--epochs", "-e", help="e: fine-tuning epochs per iteration (paper: 5 or 15)."),
    batch_size: int = typer.Option(32, help="Batch size of fine-tuning and of the hypergradient's batches."),
    base_lr: float = typer.Option(1e-3, help="Base fine-tuning LR: initial eta~ and the LR when LRNet is off."),
    q: int = typer.Option(3, help="Q: Neumann-series terms of the inverse-Hessian approximation (Alg. 2)."),
    psi: float = typer.Option(0.1, help="psi: Neumann step size (Alg. 2)."),
    psi_power: int = typer.Option(0, help="0: the paper's fixed psi. N > 0: estimate the top eigenvalue of the training-loss "
                                  "Hessian by N power iterations (N extra Hessian-vector products) and use psi = min(--psi, "
                                  "1/lambda_max), so the Neumann series converges (not in the paper: measured lambda_max 70-145 "
                                  "here, where psi 0.1 made hypergradient norms reach 1e5-1e6 with 50-90% of entries clipped). Combine with "
                                  "--scale-by-psi: unscaled, p is ~1/psi = lambda_max times H^-1 v."),
    scale_by_psi: bool = typer.Option(False, help="Multiply p by psi as Lorraine et al. do (the paper's Alg. 2 does not)."),
    meta_grad: str = typer.Option("ift", help="ift (implicit function theorem, Alg. 2) | fomaml (FOMAML+, App. F)."),
    hessian: str = typer.Option("fo", help="fo: Hessian of CE at theta' with the inner gradient held constant (second order, "
                                "~10x an SGD step) | exact: full Hessian of L_T of Eq. 9-10 (third order, ~30-40x)."),
    nets: str = typer.Option("both", help="both | bnnet (LRs fixed at --base-lr) | lrnet (beta fixed at --beta)."),
    beta: float = typer.Option(1.0, help="Fixed beta when BNNet is off (1: client statistics, 0: pretrained)."),
    local: bool = typer.Option(False, "--local", help="L2P: each client learns its own lambda alone, same compute budget."),
    lr_bnnet: float = typer.Option(1e-3, help="SGD learning rate of BNNet."),
    lr_lrnet: float = typer.Option(1e-3, help="SGD learning rate of LRNet."),
    lr_eta: float = typer.Option(1e-4, help="SGD learning rate of eta~."),
    patience: int = typer.Option(0, help="Stop after this many rounds without a lower mean validation loss (0: never)."),
    client_bn: str = typer.Option("precise", help="Client BN statistics for the validation loss after fine-tuning: precise = "
                                  "recomputed under the fine-tuned weights and the same beta (consistent with evaluation; not in "
                                  "the paper) | running = the paper's momentum-0.1 running statistics (stale for layers >= 2)."),
    hidden_bias: str = typer.Option("paper", help="Meta-net init: paper = every bias the constant 0.5 (BNNet) / 1.0 (LRNet), as "
                                    "App. E and the authors' code | zero = hidden biases 0 (an ablation: input weights then "
                                    "receive almost no gradient)."),
    beta_init: float = typer.Option(0.5, help="Constant of every BNNet bias, so every client's initial beta (App. E: 0.5). "
                                    "Another value is not in the paper: where the best fixed beta is near 1 (BN C) the "
                                    "meta-gradient moves beta too slowly from 0.5 in a small budget; starting near it "
                                    "lets clients move away from it instead."),
    init_gain: float = typer.Option(0.1, help="Xavier gain of the meta-nets' weights (App. E: 0.1). Another value is not in "
                                    "the paper: at 0.1 an output moves by ~1e-3 per unit of input, so every client gets the "
                                    "same beta and eta to 3-5 decimals and the input weights must grow ~100x before the "
                                    "meta-nets can tell clients apart; a larger gain starts them input-sensitive."),
    ift_at: str = typer.Option("star", help="Where the IFT differentiates L_T of Eq. 9-10: star = at theta* with one more "
                               "in-graph step on a fresh train batch (this project's first reading) | last-step = the last "
                               "fine-tuning step, L_T(theta_prev) with theta' = theta* on that step's batch, as the authors' "
                               "code and the paper's 'theta* = theta'' (Sec. 3.3); with --hessian fo it reuses that step's "
                               "gradient, one forward-backward fewer per hypergradient."),
    val_stats: str = typer.Option("running", help="BN statistics of the validation loss the meta-nets learn on: running = "
                                  "beta mixes the client's statistics (the paper's inference) | test-batch = beta mixes each "
                                  "validation batch's own statistics (not in the paper): meta-nets for `fedl2p personalize "
                                  "--eval-stats test-batch`, which evaluates that way. Variant suffix -valtbs."),
    eta_nonneg: bool = typer.Option(False, "--eta-nonneg", help="Clamp eta~ at 0 (straight-through), so no learned LR is "
                                    "negative: a tensor the meta-gradient pushes below 0 is frozen (counted as sparsity) instead "
                                    "of moved uphill by gradient ascent. Not in the paper (the authors' eta~ is unconstrained). "
                                    "Variant suffix -etapos."),
    input_norm: str = typer.Option("none", help="none = raw xi and x as the paper | standardize = z-score every input feature "
                                   "over the seen clients (not in the paper; the mean/SD are stored with lambda)."),
    meta_opt: str = typer.Option("fedavg", help="Server update of lambda: fedavg = the paper's sample-weighted mean | fedadam = "
                                 "Adam on the mean client change (Reddi et al. 2021; not in the paper)."),
    server_lr: float = typer.Option(1e-3, help="Step size of --meta-opt fedadam."),
    keep: str = typer.Option("best", help="Which lambda the artifact keeps: best = the paper's, the broadcast lambda of the round "
                             "whose sampled clients had the lowest mean validation loss | last = the final aggregate (not in "
                             "the paper: with few clients per round and domains of unequal difficulty, 'best' mostly picks the "
                             "round that sampled easy clients)."),
    seed: int = typer.Option(0, help="Seed (meta-net init, sampling, batches)."),
    workers: int = typer.Option(1, help="Processes that run a round's clients in parallel, one torch thread each (spawned "
                                "once per run; each loads the data once). The artifact is the same as with 1 (bit for bit; "
                                "not part of its id). Use up to the number of cores; see docs/guide/threads-devices.md."),
    engine: str = typer.Option("local", help="Where the round's client updates run: local = this process (or --workers "
                               "processes) | flower = Flower ClientApps in Flower's simulation runtime (Message API; --workers "
                               "at a time; needs pip install 'fedl2p[flower]'). The same artifact either way (bit for bit; "
                               "not part of its id)."),
    gpus_per_client: float = typer.Option(0.0, help="With --engine flower on a GPU: the share of a GPU each ClientApp "
                                          "gets (0.25 runs four ClientApps per GPU, on every GPU Ray sees). Not part of "
                                          "the artifact's id."),
    norm_bound: float = typer.Option(0.0, help="Not in the paper: drop a client whose lambda moved more than this many "
                                     "times the round's median move (0: no bound). Replies with other tensors, shapes or "
                                     "dtypes, non-finite values or an impossible sample count are always dropped; every "
                                     "drop is named in history.csv's `dropped` column."),
    aggregate: str = typer.Option("mean", "--aggregate", help="How the server combines the clients' lambdas: mean (the "
                                  "paper's FedAvg, weighted by samples) | median (coordinate-wise) | trimmed-mean "
                                  "(coordinate-wise, 20% cut at each end). The last two are not in the paper: they bound "
                                  "what a few hostile sites can do."),
    round_timeout: float = options.ROUND_TIMEOUT,
    min_answers: float = options.MIN_ANSWERS,
    round_retries: int = options.ROUND_RETRIES,
    pretrain: Optional[str] = typer.Option(None, "--pretrain", help="Pretrained-model artifact id; default: the newest."),
    stats: Optional[str] = typer.Option(None, "--stats", help="Stats artifact id; default: the newest for that model."),
    resume: bool = typer.Option(True, help="Continue from the last round checkpoint of an interrupted identical run."),
    force: bool = options.FORCE,
    store: Optional[Path] = options.STORE,
) -> None:
    """Federatedly learn the meta-nets BNNet and LRNet (and eta~) -> lambda.safetensors, history.csv, val_loss.png,
    learning.png (beta per domain, eta per layer group and meta-gradient norms per round)."""
    meta = stage.MetaConfig(iterations=iterations, epochs=epochs, batch_size=batch_size, base_lr=base_lr, q=q, psi=psi,
                      scale_by_psi=scale_by_psi, psi_power=psi_power, meta_grad=meta_grad, hessian=hessian, fixed_beta=beta,
                      lr_bnnet=lr_bnnet, lr_lrnet=lr_lrnet, lr_eta=lr_eta, client_bn=client_bn, hidden_bias=hidden_bias,
                      beta_init=beta_init, init_gain=init_gain, ift_at=ift_at,
                      val_stats=val_stats, eta_nonneg=eta_nonneg)
    cfg = stage.MetaTrainConfig(rounds=rounds, fraction=fraction, nets=nets, local=local, patience=patience, seed=seed,
                                input_norm=input_norm, meta_opt=meta_opt, server_lr=server_lr, keep=keep, workers=workers, engine=engine,
                                gpus_per_client=gpus_per_client, norm_bound=norm_bound, aggregator=aggregate,
                                round_timeout=round_timeout, min_answers=min_answers, round_retries=round_retries, meta=meta)
    art, reused = stage.run(cfg, options.store(store), pretrain, stats, force, resume, render.RichProgress())
    show(art.metrics)
    render.artifact_line("meta-train", art.id, art.path, reused)


def show(m: dict) -> None:
    if m.get("diverged"):
        render.err_console.print(f"[yellow]warning:[/yellow] training diverged ({m['diverged']}); the best lambda so far was kept")
    render.table(f"meta-training ({m['variant']})", ["metric", "value"],
                 [[k, v] for k, v in m.items() if k not in ("variant", "diverged")])
