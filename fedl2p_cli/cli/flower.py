"""`fedl2p flower ...`: prepare a Flower deployment of meta-training (sites' data folders, the app's run config)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..errors import FedL2PError
from ..configs import MetaTrainConfig
from . import options, render
from ..runtime import Runtime
from .generate import config_command

app = typer.Typer(help="Prepare a Flower deployment of FedL2P meta-training: `fedl2p flower app DIR` writes the Flower "
                  "app, `flwr run DIR` runs it against a SuperLink "
                  "with one SuperNode per client site (docs/deployment.md). Secure it with TLS and SuperNode "
                  "authentication (`credentials` makes test credentials for a trial); Flower's insecure mode "
                  "(--insecure) sends everything in clear and lets anyone join: loopback only.", no_args_is_help=True)
flower_app = options.Lazy("fedl2p_cli.stages.flower_app")
meta_stage = options.Lazy("fedl2p_cli.stages.meta_train")


APP = Path(__file__).resolve().parent.parent / "flower_app"  # package data: the app's pyproject.toml


@app.command("app")
def write_app(
    out: Optional[Path] = typer.Argument(None, help="Folder to write the Flower app to (its pyproject.toml); without "
                                         "it, print the installed app's folder.", show_default=False),
) -> None:
    """The Flower app that `flwr run` takes (a pyproject.toml naming fedl2p's ServerApp and ClientApp): written to
    OUT for `flwr run OUT <connection>`, or, without OUT, the folder of the one installed with fedl2p printed."""
    text = (APP / "pyproject.toml").read_text()
    if out is None:
        typer.echo(str(APP))
        return
    target = out / "pyproject.toml"
    if target.exists() and target.read_text() != text:
        raise FedL2PError(f"{target} exists and is not fedl2p's Flower app: give an empty or new folder")
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".pyproject.toml.tmp"
    tmp.write_text(text)
    tmp.replace(target)  # atomic: never a half-written app
    render.console.print(f"Flower app: {out} (flwr run {out} <connection> --run-config RUN.toml)")


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


# a deployment has no central statistics (--input-norm); its sites compute on their own devices, so of the runtime
# options only the failure policy applies
NOT_DEPLOYED = ("local", "input_norm")
DEPLOYED_RUNTIME = ("round_timeout", "min_answers", "round_retries")


@app.command("run-config")
@config_command(MetaTrainConfig, skip=NOT_DEPLOYED, runtime=DEPLOYED_RUNTIME)
def run_config(
    cfg: MetaTrainConfig,
    rt: Runtime,
    out: Path = typer.Option(..., help="Folder for run.toml, the model copy the ServerApp sends, and the run's results."),
    sites: int = typer.Option(..., min=1, help="SuperNodes (client sites) the ServerApp waits for."),
    pretrain: Optional[str] = typer.Option(None, "--pretrain", help="Pretrained-model artifact id; default: the newest."),
    store: Optional[Path] = options.STORE,
) -> None:
    """Write OUT/run.toml for `flwr run APP <connection> --run-config OUT/run.toml`; the ServerApp writes
    OUT/lambda.safetensors and OUT/history.csv. The meta-training options are `fedl2p meta-train`'s."""
    meta_stage.check(cfg, rt)
    rc = flower_app.run_config(options.store(store), pretrain, cfg, sites, out, rt)
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
    hosts = options.csv_list(host, "--host") or []
    if not hosts:
        raise FedL2PError("--host needs at least one name or address")
    written = flower_certs.make(out, sites, hosts)
    render.console.print(f"wrote {len(written)} files to {out}: give the SuperLink ca.crt, server.pem and server.key; "
                         "each site its site<i>.key and ca.crt; register each site<i>.pub with `flwr supernode register`")
