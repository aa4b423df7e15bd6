"""The `fedl2p` command: one module per stage; errors become one line and a non-zero exit here."""

from __future__ import annotations

import os
import sys

import typer
from rich.markup import escape

from .. import imports, tracking
from ..errors import USER_ERRORS
from ..stage_table import TABLE, Stage
from . import artifacts, flower, render
from .run import run

app = typer.Typer(
    help="FedL2P: federatedly learn per-client personalisation strategies and compare them with hand-made ones.",
    no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        from .. import __version__
        typer.echo(f"fedl2p {__version__}")
        raise typer.Exit()


@app.callback()
def _global(ctx: typer.Context,
            version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                         help="Print fedl2p's version and exit."),
            plugin: list[str] | None = typer.Option(None, "--plugin", metavar="MODULE",
                                                       help="Load a plugin module (repeatable) that adds pieces: "
                                                            "models, datasets, methods, pFL systems, executors... See "
                                                            "docs/guide/extending.md."),
            store: str | None = typer.Option(None, "--store", metavar="DIR",
                                                help="Artifact store folder for the command, as its own --store "
                                                     "(default: FEDL2P_STORE, else ./artifacts)."),
            allow_import: list[str] | None = typer.Option(None, "--allow-import", metavar="MODULE",
                                                             help="Trust MODULE where an artifact names it as its "
                                                                  "model (repeatable; or FEDL2P_ALLOW_IMPORT)."),
            threads: int = typer.Option(1, "--threads", envvar="FEDL2P_THREADS", min=1,
                                        help="Torch CPU threads per process (default 1: fastest for small models on a "
                                             "busy machine). See docs/guide/threads-devices.md."),
            device: str | None = typer.Option(None, "--device", envvar="FEDL2P_DEVICE", show_default="auto",
                                                 help="Where every stage computes: auto (a CUDA GPU if present, else "
                                                      "the CPU), cpu, cuda or cuda:N. Not part of artifact ids."),
            deterministic: bool = typer.Option(False, "--deterministic", envvar="FEDL2P_DETERMINISTIC",
                                               help="cuDNN's deterministic kernels and torch.use_deterministic_algorithms: "
                                               "a GPU run repeats bit for bit (a little slower). CPU runs always do."),
            lock_timeout: float | None = typer.Option(None, "--lock-timeout", envvar="FEDL2P_LOCK_TIMEOUT", min=0,
                                                         show_default="no limit",
                                                         help="Seconds to wait while another fedl2p process builds the "
                                                              "same artifact, then reuse it; 0 refuses at once."),
            track: str | None = typer.Option(None, "--track", envvar="FEDL2P_TRACK", show_default="off",
                                                help="Log every round and each artifact's metrics to tensorboard or "
                                                     "mlflow (extras of those names). Not part of any artifact's id."),
            track_uri: str | None = typer.Option(None, "--track-uri", envvar="FEDL2P_TRACK_URI",
                                                    show_default="./runs or ./mlruns",
                                                    help="Where --track logs: a local folder (the default: nothing is "
                                                    "sent anywhere) or an MLflow server URI.")) -> None:
    """--device, --deterministic, --threads, --lock-timeout and --track become each command's Runtime (cli/options.py
    `runtime`); --track is checked here, before any command runs."""
    from .generate import load_pieces
    ctx.obj = {"plugin": plugin or []}
    if ctx.invoked_subcommand != "flower":  # `flower` loads them for the commands that need pieces (cli/flower.py)
        load_pieces(ctx)
    tracking.check(track, track_uri)


def _stage_command(stage: Stage) -> None:
    """A stage's command (the stage table's), one line in `fedl2p --help`: a command with its example, or a group."""
    target = imports.load(stage.cli or "", imports.Why.OWN)
    if isinstance(target, typer.Typer):
        app.add_typer(target, name=stage.command, short_help=stage.help)
    else:
        app.command(stage.command, short_help=stage.help, epilog=f"Example: {stage.example}")(target)


for _stage in TABLE.rows:  # the stages in pipeline order, then the commands that are no stage
    if _stage.command:
        _stage_command(_stage)
app.command("run", short_help="Run a pipeline file: every stage in order, reusing existing artifacts.",
            epilog="Example: fedl2p run quickstart")(run)
app.add_typer(artifacts.app, name="artifacts", short_help="See what the store holds and where it came from.")
app.add_typer(flower.app, name="flower", short_help="Deploy meta-training across real sites with Flower.")


def _for_terminal(cmd) -> None:
    """Ready the click command tree for Rich's help: markup parsed under every typer version, every help text escaped
    (so `pip install 'fedl2p[flower]'` keeps its `[flower]`), and no value placeholder (`<bool>`) shown for a flag."""
    if hasattr(cmd, "rich_markup_mode"):
        cmd.rich_markup_mode = "rich"
    for attr in ("help", "short_help", "epilog"):
        if getattr(cmd, attr, None):
            setattr(cmd, attr, escape(getattr(cmd, attr)))
    help_option = cmd.get_help_option(cmd.context_class(cmd))
    for param in [*cmd.params, *([help_option] if help_option is not None else [])]:
        if getattr(param, "help", None):
            param.help = escape(param.help)
        if getattr(param, "is_flag", False):
            param.metavar = ""
    for sub in getattr(cmd, "commands", {}).values():
        _for_terminal(sub)


def run_cli(argv: list[str] | None = None) -> int:
    """Run the command line and return its exit code. The one place where errors become what the user sees:
    a problem the user can fix is one line and exit 2, a bug one line and exit 1 (the traceback with
    FEDL2P_DEBUG=1). Tests call this in-process; `main` is the console entry point."""
    debug = bool(os.environ.get("FEDL2P_DEBUG"))
    try:
        command = typer.main.get_command(app)
        _for_terminal(command)
        command(argv, prog_name="fedl2p")
    except SystemExit as e:  # click's own exit: 0, or 2 for a usage error it has printed
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except USER_ERRORS as e:
        render.err_console.print(f"[red]error:[/red] {escape(str(e))}", highlight=False)
        return 2
    except KeyboardInterrupt:
        render.err_console.print("interrupted; re-run the same command to resume", highlight=False)
        return 130
    except OSError as e:
        if debug:
            raise
        render.err_console.print(f"[red]error:[/red] {e.__class__.__name__}: {escape(str(e))}", highlight=False)
        return 2
    except Exception as e:  # a bug: still one line, the traceback on request
        if debug:
            raise
        render.err_console.print(f"[red]internal error:[/red] {e.__class__.__name__}: {escape(str(e))} "
                                 "(set FEDL2P_DEBUG=1 for the traceback)",
                                 highlight=False)
        return 1
    return 0


def main() -> None:
    sys.exit(run_cli())
