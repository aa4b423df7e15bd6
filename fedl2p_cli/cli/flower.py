"""`fedl2p flower ...`: prepare a Flower deployment of meta-training (sites' data folders, the app's run config)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import typer

from ..configs import MetaTrainConfig
from ..errors import FedL2PError
from ..flower.config import CredentialsConfig, ExportSiteConfig, FlowerRunConfig, GatewayConfig, KeygenConfig, NginxEdgeConfig
from ..runtime import Runtime
from . import options, render
from .generate import config_command

app = typer.Typer(help="Deploy FedL2P meta-training with Flower: `fedl2p flower run-config` writes a run, "
                  "`fedl2p flower gateway` exposes only the Fleet API (or `edge` writes nginx's configuration for it), "
                  "`fedl2p flower run` runs it against a SuperLink "
                  "with one SuperNode per client site (docs/deployment.md). Secure it with TLS and SuperNode "
                  "authentication (`credentials` makes test credentials for a trial); Flower's insecure mode "
                  "(--insecure) sends everything in clear and lets anyone join: loopback only.", no_args_is_help=True)
flower_app = options.Lazy("fedl2p_cli.flower.app")
# what the server and the sites' operators run outside the store: no model, dataset or method, so neither plugins nor
# torch are loaded (the gateway is a long-lived process facing the network: it stays small)
NO_PIECES = {"app", "credentials", "keygen", "gateway", "edge", "run"}


@app.callback()
def _pieces(ctx: typer.Context) -> None:
    from .generate import load_pieces
    if ctx.invoked_subcommand not in NO_PIECES:
        load_pieces(ctx)
meta_stage = options.Lazy("fedl2p_cli.stages.meta_train")


APP = Path(__file__).resolve().parent.parent / "flower" / "project"  # package data: the app's pyproject.toml


@app.command("app")
def write_app(
    out: Path | None = typer.Argument(None, help="Folder to write the Flower app to (its pyproject.toml); without "
                                         "it, print the installed app's folder.", show_default=False),
) -> None:
    """The Flower app that `flwr run` takes (a pyproject.toml naming fedl2p's ServerApp and ClientApp): written to
    OUT for `flwr run OUT <connection>`, or, without OUT, the folder of the one installed with fedl2p printed."""
    text = (APP / "pyproject.toml").read_text()
    if out is None:
        typer.echo(str(APP))
        return
    target = out / "pyproject.toml"
    if target.exists() and (old := target.read_text()) != text and not _ours(old):
        raise FedL2PError(f"{target} exists and is not fedl2p's Flower app: give an empty or new folder")
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".pyproject.toml.tmp"
    tmp.write_text(text)
    tmp.replace(target)  # atomic: never a half-written app
    render.console.print(f"Flower app: {out} (flwr run {out} <connection> --run-config RUN.toml)")


def _ours(text: str) -> bool:
    """A Flower app project fedl2p wrote (another version's: it is rewritten with this one's component names)."""
    return 'name = "fedl2p-meta-train"' in text and 'publisher = "fedl2p"' in text


@app.command("export-site")
@config_command(ExportSiteConfig)
def export_site(
    cfg: ExportSiteConfig,
    partition: str | None = options.PARTITION,
    store: Path | None = options.STORE,
) -> None:
    """Write one client's normalised train/validation data as a site folder (site.safetensors): how to try a
    deployment with a partition's clients. A real site writes the same file from its own data."""
    from ..core.config import validate
    from ..stages import partition as partition_stage
    validate(cfg)
    client = int(cfg.client or 0)
    _, part = partition_stage.load(options.store(store), partition)
    if not 0 <= client < len(part.offsets):
        raise FedL2PError(f"--client {client} is not in the partition (0..{len(part.offsets) - 1})")
    path = flower_app.export_site(part.client(client), client, Path(str(cfg.out)))
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
    site_names: str | None = typer.Option(None, help="Comma-separated site-names of the run's sites (the "
                                             "SuperNodes' node-config site-name): any other node is not sampled."),
    pretrain: str | None = options.PRETRAIN,
    store: Path | None = options.STORE,
) -> None:
    """Write OUT/run.toml for `flwr run APP <connection> --run-config OUT/run.toml`; the ServerApp writes
    OUT/lambda.safetensors and OUT/history.csv. The meta-training options are `fedl2p meta-train`'s."""
    meta_stage.check(cfg, rt)
    names = options.csv_list(site_names, "--site-names") if site_names is not None else None
    rc = flower_app.run_config(options.store(store), pretrain, cfg, sites, out, rt, names)
    text = "".join(f"{k} = {json.dumps(v)}\n" for k, v in rc.items())  # JSON strings and ints are valid TOML
    (out / "run.toml").write_text(text)
    render.console.print(f"run config: {out / 'run.toml'}")


@app.command("import")
def import_run(
    ctx: typer.Context,
    out: Path = typer.Argument(..., help="The folder `flwr run` wrote lambda.safetensors and history.csv to (the run "
                               "config's --out, with its run.toml)."),
    store: Path | None = options.STORE,
) -> None:
    """Bring a deployment's result into the store as a meta-train artifact of its pretrained model:
    `fedl2p personalize --meta ID` then compares it with the hand-made strategies."""
    art, reused = flower_app.import_run(options.store(store), out, options.store_runtime(ctx))
    render.artifact_line("meta-train", art.id, art.path, reused)


@app.command("credentials")
@config_command(CredentialsConfig)
def credentials(cfg: CredentialsConfig) -> None:
    """Test credentials for a secured local trial: a CA, the SuperLink's TLS certificate and one key pair per
    SuperNode for Flower's SuperNode authentication (valid 30 days). For a trial only: a real federation takes its
    certificate from an authority its sites trust, and each site makes its own key pair."""
    from ..core.config import validate
    from ..flower import certs as flower_certs
    validate(cfg)
    hosts = options.csv_list(cfg.host, "--host") or []
    if not hosts:
        raise FedL2PError("--host needs at least one name or address")
    out = Path(str(cfg.out))
    written = flower_certs.make(out, cfg.sites, hosts)
    render.console.print(f"wrote {len(written)} files to {out}: give the SuperLink ca.crt, server.pem and server.key; "
                         "each site its site<i>.key and ca.crt; register each site<i>.pub with `flwr supernode register`")
    _warn_work_tree(out)


def _warn_work_tree(out: Path) -> None:
    from ..flower import certs as flower_certs
    if (text := flower_certs.warning(out)) is not None:
        render.err_console.print(f"[yellow]warning:[/yellow] {text}", highlight=False)


@app.command("keygen")
@config_command(KeygenConfig)
def keygen(cfg: KeygenConfig) -> None:
    """A site's own key pair for SuperNode authentication: the site keeps NAME.key (owner-only) and hands only
    NAME.pub to the server operator, who registers it with `flwr supernode register`."""
    from ..flower import certs as flower_certs
    out = Path(str(cfg.out))
    key, pub = flower_certs.keygen(out, cfg.name)
    render.console.print(f"private key {key} (keep it here; start the SuperNode with --auth-supernode-private-key "
                         f"{key}); public key {pub} (hand this one to the server operator)")
    _warn_work_tree(out)


@app.command("gateway")
@config_command(GatewayConfig)
def gateway(cfg: GatewayConfig) -> None:
    """Expose only the SuperLink's Fleet API to the network: forward the Fleet endpoints a site needs (POST, exact
    paths) to the SuperLink on loopback, and answer everything else here (Control and ServerAppIo APIs included)."""
    from ..core.config import validate
    from ..flower import gateway as gw
    validate(cfg)
    path = lambda p: None if p is None else Path(p)  # noqa: E731
    gw.serve(cfg.listen, cfg.superlink, path(cfg.certfile), path(cfg.keyfile), path(cfg.ca), cfg.limits(), cfg.host_name,
             cfg.allow_self_registration, path(cfg.access_log))


@app.command("edge")
@config_command(NginxEdgeConfig)
def edge(cfg: NginxEdgeConfig) -> None:
    """Write an nginx configuration for the public edge instead of running the gateway: the same Fleet allowlist,
    with per-prefix connection and request limits (503), timeouts and a body size limit. Start it with
    `nginx -c FILE`; the deployment guide says when to choose which edge."""
    from ..core.config import validate
    from ..flower import edge_nginx
    validate(cfg)
    out = edge_nginx.write(cfg)
    render.console.print(f"nginx configuration {out} (start: nginx -c {out.resolve()}; check: nginx -t -c "
                         f"{out.resolve()})")


@app.command("run")
@config_command(FlowerRunConfig)
def run(
    cfg: FlowerRunConfig,
    out: Path = typer.Argument(..., help="The run config's folder (`run-config --out`): run.toml, and the results."),
) -> None:
    """`flwr run` of the app with OUT/run.toml, streaming the ServerApp's log (a line per round), then exit by the
    run's outcome: 0 when it completed, 1 with the reason when it failed (a round without --min-answers' sites)."""
    import shutil
    import subprocess
    import sys
    app_dir, connection = Path(cfg.app) if cfg.app else APP, cfg.connection
    if not (app_dir / "pyproject.toml").is_file():
        raise FedL2PError(f"--app {app_dir} is not a Flower app folder (no pyproject.toml)")
    if not (out / "run.toml").is_file():
        raise FedL2PError(f"{out} has no run.toml: write it with `fedl2p flower run-config --out {out}`")
    flwr = shutil.which("flwr")
    if flwr is None:
        raise FedL2PError("flwr is not installed here: pip install -e '.[flower]'")
    (out / "status.json").unlink(missing_ok=True)
    cmd = [flwr, "run", str(app_dir), *([connection] if connection else []), "--run-config",
           str((out / "run.toml").resolve()), "--stream"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        for line in quiet_own_tracebacks(proc.stdout or ()):  # stdout=PIPE: never None
            sys.stdout.write(line)
            sys.stdout.flush()
    code = proc.returncode
    try:
        status = json.loads((out / "status.json").read_text())
    except (OSError, json.JSONDecodeError):
        status = {"status": "unknown", "reason": f"flwr run exited {code} and the ServerApp wrote no status (see "
                                                 f"{out / 'server.log'} and `flwr ls`); run again to resume"}
    if status["status"] != "completed":
        render.err_console.print(f"[red]run {status['status']}:[/red] {status['reason']}", highlight=False)
        raise typer.Exit(1)
    render.console.print(f"run completed: {out / 'lambda.safetensors'}, {out / 'history.csv'}")


def quiet_own_tracebacks(lines: Iterable[str]) -> Iterator[str]:
    """flwr's streamed log, less the tracebacks of this package's own one-line failures (a round without enough
    sites, a site claimed twice): their reason is this command's last line, so 20 lines of ServerApp frames before
    it only hide it. Any other traceback (a bug) passes whole."""
    held: list[str] = []
    for line in lines:
        if held:
            held.append(line)
            if line[:1] not in (" ", "\t", "") and not line.startswith("Traceback"):  # the exception's own line
                if "FedL2PError" not in line:
                    yield from held
                held = []
        elif "Traceback (most recent call last):" in line:
            held = [line]
        else:
            yield line
    yield from held
