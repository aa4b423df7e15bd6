"""`fedl2p flower ...`: prepare a Flower deployment of meta-training (sites' data folders, the app's run config)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..errors import FedL2PError
from . import options, render

app = typer.Typer(help="Prepare a Flower deployment of FedL2P meta-training: `flwr run flower_app` against a SuperLink "
                  "with one SuperNode per client site (docs/deployment.md). Secure it with TLS and SuperNode "
                  "authentication (`credentials` makes test credentials for a trial); Flower's insecure mode "
                  "(--insecure) sends everything in clear and lets anyone join: loopback only.", no_args_is_help=True)
flower_app = options.Lazy("fedl2p_cli.stages.flower_app")
meta_stage = options.Lazy("fedl2p_cli.stages.meta_train")


@app.command("export-site")
def export_site(
    client: int = typer.Option(..., help="Client id in the partition."),
    out: Path = typer.Option(..., help="The site's folder (its SuperNode starts with --node-config \"site-dir='OUT'\")."),
    partition: Optional[str] = typer.Option(None, "--partition", help="Partition artifact id; default: the newest."),
    store: Optional[Path] = options.STORE,
) -> None:
    """Write one client's normalised train/validation data as a site folder (site.safetensors): how to try a
    deployment with a partition's clients. A real site writes the same file from its own data."""
    from ..stages import partition as partition_stage
    _, part = partition_stage.load(options.store(store), partition)
    if not 0 <= client < len(part.offsets):
        raise FedL2PError(f"--client {client} is not in the partition (0..{len(part.offsets) - 1})")
    path = flower_app.export_site(part.client(client), client, out)
    render.console.print(f"site of client {client}: {path}")


@app.command("run-config")
def run_config(
    out: Path = typer.Option(..., help="Folder for run.toml, the model copy the ServerApp sends, and the run's results."),
    sites: int = typer.Option(..., min=1, help="SuperNodes (client sites) the ServerApp waits for."),
    rounds: int = typer.Option(30, min=1, help="Communication rounds."),
    fraction: float = typer.Option(0.5, min=0.0, max=1.0, help="Share of the sites sampled per round."),
    iterations: int = typer.Option(3, min=1, help="Meta-iterations K per sampled site and round."),
    epochs: int = typer.Option(5, min=1, help="Fine-tuning epochs e inside each meta-iteration."),
    base_lr: float = typer.Option(0.001, help="Fine-tuning base learning rate (the LRNet output scale)."),
    meta_grad: str = typer.Option("ift", help="ift (Alg. 2) | fomaml (FOMAML+, App. F)."),
    beta_init: float = typer.Option(0.5, help="BNNet bias constant (App. E: 0.5; see meta-train --help)."),
    keep: str = typer.Option("best", help="best (the paper's lowest-validation-loss round) | last."),
    seed: int = typer.Option(0, help="Seed (meta-net init, sampling, batches)."),
    norm_bound: float = typer.Option(0.0, help="Drop a site whose lambda moved more than this many times the round's "
                                     "median move (0: no bound; see meta-train --help). Malformed or non-finite replies "
                                     "are always dropped."),
    aggregate: str = typer.Option("mean", "--aggregate", help="mean (the paper's FedAvg) | median | trimmed-mean "
                                  "(coordinate-wise; not in the paper: they bound what a few hostile sites can do)."),
    round_timeout: float = options.ROUND_TIMEOUT,
    min_answers: float = options.MIN_ANSWERS,
    round_retries: int = options.ROUND_RETRIES,
    pretrain: Optional[str] = typer.Option(None, "--pretrain", help="Pretrained-model artifact id; default: the newest."),
    store: Optional[Path] = options.STORE,
) -> None:
    """Write OUT/run.toml for `flwr run flower_app <connection> --run-config OUT/run.toml`; the ServerApp writes
    OUT/lambda.safetensors and OUT/history.csv."""
    meta = meta_stage.MetaConfig(iterations=iterations, epochs=epochs, base_lr=base_lr, meta_grad=meta_grad,
                                 beta_init=beta_init)
    cfg = meta_stage.MetaTrainConfig(rounds=rounds, fraction=fraction, seed=seed, keep=keep, norm_bound=norm_bound,
                                     aggregator=aggregate, round_timeout=round_timeout, min_answers=min_answers,
                                     round_retries=round_retries, meta=meta)
    meta_stage.check(cfg)
    rc = flower_app.run_config(options.store(store), pretrain, cfg, sites, out)
    text = "".join(f"{k} = {json.dumps(v)}\n" for k, v in rc.items())  # JSON strings and ints are valid TOML
    (out / "run.toml").write_text(text)
    render.console.print(f"run config: {out / 'run.toml'}")


@app.command("import")
def import_run(
    out: Path = typer.Argument(..., help="The folder `flwr run` wrote lambda.safetensors and history.csv to (the run "
                               "config's --out, with its run.toml)."),
    store: Optional[Path] = options.STORE,
) -> None:
    """Bring a deployment's result into the store as a meta-train artifact of its pretrained model:
    `fedl2p personalize --meta ID` then compares it with the hand-made strategies."""
    art, reused = flower_app.import_run(options.store(store), out)
    render.artifact_line("meta-train", art.id, art.path, reused)


@app.command("credentials")
def credentials(
    out: Path = typer.Option(..., help="Folder for ca.crt, server.pem, server.key and site<i>.key / site<i>.pub."),
    sites: int = typer.Option(..., min=1, help="SuperNodes to make authentication key pairs for."),
    host: Optional[str] = typer.Option("127.0.0.1,localhost", help="Comma-separated names and addresses the "
                                       "SuperLink's certificate is valid for (what SuperNodes and flwr connect to)."),
) -> None:
    """Test credentials for a secured local trial: a CA, the SuperLink's TLS certificate and one key pair per
    SuperNode for Flower's SuperNode authentication (valid 30 days). For a trial only: a real federation takes its
    certificate from an authority its sites trust, and each site makes its own key pair."""
    from ..stages import flower_certs
    hosts = options.csv_list(host) or []
    if not hosts:
        raise FedL2PError("--host needs at least one name or address")
    written = flower_certs.make(out, sites, hosts)
    render.console.print(f"wrote {len(written)} files to {out}: give the SuperLink ca.crt, server.pem and server.key; "
                         "each site its site<i>.key and ca.crt; register each site<i>.pub with `flwr supernode register`")
