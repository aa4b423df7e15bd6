"""The `fedl2p` command: one module per stage; errors become one line and a non-zero exit here."""

from __future__ import annotations

import os
import sys

import typer

from ..errors import FedL2PError
from . import analyze, artifacts, meta_train, partition, personalize, pretrain, render, stats
from .run import run

app = typer.Typer(
    help="FedL2P: federatedly learn per-client personalisation strategies and compare them with hand-made ones.",
    no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
)


@app.callback()
def _global(threads: int = typer.Option(1, "--threads", envvar="FEDL2P_THREADS", min=1,
                                        help="Torch CPU threads. Default 1: on a shared 2-core machine torch's default (all "
                                        "cores) made a meta-train round take 109 s instead of 4.4 s when another process "
                                        "was busy, and for the small CNN one thread is as fast as two. Raise it for big "
                                        "models on an idle machine.")) -> None:
    import torch
    torch.set_num_threads(threads)
app.command()(partition.partition)
app.command()(pretrain.pretrain)
app.command()(stats.stats)
app.command("meta-train")(meta_train.meta_train)
app.command()(personalize.personalize)
app.command()(run)
app.add_typer(analyze.app, name="analyze")
app.add_typer(artifacts.app, name="artifacts")


def main() -> None:
    debug = bool(os.environ.get("FEDL2P_DEBUG"))
    try:
        app()
    except FedL2PError as e:
        render.err_console.print(f"[red]error:[/red] {e}", highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        render.err_console.print("interrupted; re-run the same command to resume", highlight=False)
        sys.exit(130)
    except OSError as e:
        if debug:
            raise
        render.err_console.print(f"[red]error:[/red] {e.__class__.__name__}: {e}", highlight=False)
        sys.exit(2)
    except Exception as e:  # a bug: still one line, the traceback on request
        if debug:
            raise
        render.err_console.print(f"[red]internal error:[/red] {e.__class__.__name__}: {e} (set FEDL2P_DEBUG=1 for the traceback)",
                                 highlight=False)
        sys.exit(1)
