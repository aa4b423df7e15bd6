"""The `fedl2p` command: one module per stage; errors become one line and a non-zero exit here."""

from __future__ import annotations

import os
import sys
from typing import Optional

import typer
from rich.markup import escape

from ..errors import USER_ERRORS
from . import analyze, artifacts, flower, meta_train, partition, personalize, pfl, pretrain, render, stats
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
                                        "models on an idle machine."),
            device: Optional[str] = typer.Option(None, "--device", envvar="FEDL2P_DEVICE", show_default="auto",
                                                 help="Where every stage computes: auto (the first CUDA GPU when one is "
                                                 "present, else the CPU), cpu, cuda or cuda:N. A pipeline file's top-level "
                                                 "`device` key applies when this is not given. Not part of an artifact's id; "
                                                 "its manifest records it (computed_on). GPU results agree with the CPU's to "
                                                 "float32 rounding, not bit for bit."),
            deterministic: bool = typer.Option(False, "--deterministic", envvar="FEDL2P_DETERMINISTIC",
                                               help="cuDNN's deterministic kernels and torch.use_deterministic_algorithms: "
                                               "a GPU run repeats bit for bit (a little slower). CPU runs always do."),
            lock_timeout: Optional[float] = typer.Option(None, "--lock-timeout", envvar="FEDL2P_LOCK_TIMEOUT", min=0,
                                                         show_default="no limit",
                                                         help="Seconds to wait while another fedl2p process builds the same "
                                                         "artifact (two pipelines sharing a partition, a script run twice); "
                                                         "then its artifact is reused. 0 refuses at once.")) -> None:
    import torch

    from .. import device as dev
    from ..artifacts import LOCK_WAIT
    torch.set_num_threads(threads)
    LOCK_WAIT.timeout = lock_timeout
    dev.use(device or "auto", deterministic, explicit=device is not None)
app.command()(partition.partition)
app.command()(pretrain.pretrain)
app.command()(stats.stats)
app.command("meta-train")(meta_train.meta_train)
app.command("pfl-train")(pfl.pfl_train)
app.command()(personalize.personalize)
app.command()(run)
app.add_typer(analyze.app, name="analyze")
app.add_typer(artifacts.app, name="artifacts")
app.add_typer(flower.app, name="flower")


def run_cli(argv: list[str] | None = None) -> int:
    """Run the command line and return its exit code. The one place where errors become what the user sees:
    a problem the user can fix is one line and exit 2, a bug one line and exit 1 (the traceback with
    FEDL2P_DEBUG=1). Tests call this in-process; `main` is the console entry point."""
    debug = bool(os.environ.get("FEDL2P_DEBUG"))
    try:
        app(argv, prog_name="fedl2p")
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
        render.err_console.print(f"[red]internal error:[/red] {e.__class__.__name__}: {escape(str(e))} (set FEDL2P_DEBUG=1 for the traceback)",
                                 highlight=False)
        return 1
    return 0


def main() -> None:
    sys.exit(run_cli())
