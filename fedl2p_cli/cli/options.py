"""Options shared by several commands."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NewType

import typer

from .. import imports
from ..artifacts import Store
from ..errors import FedL2PError
from ..runtime import Runtime


def _store(ctx: typer.Context, param: typer.CallbackParam, value: Path | None) -> Path | None:
    """A command's --store, else the one given before the command (`fedl2p --store X run ...`), else FEDL2P_STORE."""
    source = ctx.get_parameter_source(param.name or "store")
    if getattr(source, "name", None) == "COMMANDLINE":  # by name: typer's click may be its own copy
        return value
    before = ctx.find_root().params.get("store")
    return value if before is None else before


STORE = typer.Option(None, "--store", envvar="FEDL2P_STORE", callback=_store,
                     help="Artifact store folder (default: ./artifacts); also taken before the command.")
FORCE = typer.Option(False, "--force", help="Rebuild the artifact even if one with the same inputs exists.")
PERSONALIZE = typer.Option(None, "--personalize", help="Personalize artifact id; default: the newest.")
# the parent artifacts several commands read, and --resume of the commands with rounds: declared once here
PARTITION = typer.Option(None, "--partition", help="Partition artifact id (prefix); default: the newest.")
PRETRAIN = typer.Option(None, "--pretrain", help="Pretrained-model artifact id (prefix); default: the newest.")
STATS = typer.Option(None, "--stats", help="Stats artifact id (prefix); default: the newest for that model.")
RESUME = typer.Option(True, help="Continue from the last round checkpoint of an interrupted identical run.")


def store(path: Path | None) -> Store:
    return Store(path)


def execute(stage: Any, cfg: Any, parents: dict[str, str | list[str] | None], path: Path | None, rt: Runtime,
            force: bool, **ctx: Any) -> Any:
    """A command's stage run through the stage interface: the parent ids the command line gave (None: the stage's
    default), the store at `path`, and the rest of the context (progress, resume, plot). A `package.module:factory`
    model its config names is the user's: allowed here, at the edge, in the runtime the stage receives (its
    `allow_import`; the stages never change the catalog)."""
    from ..stages.interface import Inputs, StageContext, run_stage  # with the stage, so --help stays torch-free
    if ":" in str(getattr(cfg, "model", "")):
        rt = rt.replace(allow_import=(*rt.allow_import, cfg.model.partition(":")[0]))
    return run_stage(stage, cfg, Inputs.given(parents), StageContext(store(path), rt, force, **ctx))


def csv_list(value: str | None, option: str = "a list option") -> list[str] | None:
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise FedL2PError(f"{option}: an empty list was given")
    return items


def typed_list(value: str | None, cast: type = str, option: str = "a list option") -> list | None:
    """`1,2,3` -> [1, 2, 3] with each item cast (int, float or str); None -> None. `option` names it in errors."""
    items = csv_list(value, option)
    try:
        return None if items is None else [cast(v) for v in items]
    except ValueError:
        word = {int: "integers", float: "numbers"}.get(cast, "values")
        raise FedL2PError(f"{option}: expected comma-separated {word}, got '{value}'") from None


def domain_values(value: str | None, cast: type, option: str) -> dict:
    """`clean=0.05,invert=1000` -> {"clean": 0.05, "invert": 1000.0} (a per-domain option); None -> {}."""
    out = {}
    for item in csv_list(value, option) or []:
        name, sep, v = item.partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError
            out[name.strip()] = cast(v)
        except ValueError:
            raise FedL2PError(f"{option} takes domain=value pairs separated by commas, got '{item}'") from None
    return out


def runtime(ctx: typer.Context, device: str | None = None, **options: Any) -> Runtime:
    """This command's Runtime, built once and applied to this process: the global options (`fedl2p --device
    --deterministic --threads --lock-timeout --track --track-uri`; `device`, a pipeline file's, applies when --device
    was not given) and the command's own runtime options (--workers, --engine, --gpus-per-client, the failure
    policy)."""
    from ..core.config import validate
    g = ctx.find_root().params
    rt = Runtime.create(g.get("device") or device or "auto", deterministic=bool(g.get("deterministic")),
                        threads=int(g.get("threads") or 1), **store_options(ctx), **options)
    validate(rt)  # a bad value: one line naming the option
    if (line := auto_engine_line(rt, "engine" in options)) is not None:
        from .render import err_console
        err_console.print(line, highlight=False, markup=False)
    return rt.apply()


def auto_engine_line(rt: Runtime, has_engine: bool) -> str | None:
    """The one line a command on a GPU says when it batches clients by default (`--engine auto`), else None."""
    if not (rt.on_gpu and rt.engine == "auto"):
        return None
    how = "--engine batched --client-batch auto" if has_engine else "--client-batch auto"
    return (f"{rt.device}: clients run as vmapped groups ({how}); --client-batch 1 for one at a time, --engine local "
            "for --workers processes")


# the `rt` of a command that computes on no device (config_command hands it `store_runtime`)
StoreRuntime = NewType("StoreRuntime", Runtime)


def store_options(ctx: typer.Context) -> dict[str, Any]:
    """What every build reads, whatever it computes on: --lock-timeout, --track, --track-uri, the modules the user
    allowed (--allow-import) and the catalog of pieces (the built-ins, the installed plugins and --plugin's)."""
    from .. import plugins
    g = ctx.find_root().params
    return {"lock_timeout": g.get("lock_timeout"), "track": g.get("track"), "track_uri": g.get("track_uri"),
            "allow_import": tuple(g.get("allow_import") or ()), "catalog": plugins.current()}


def store_runtime(ctx: typer.Context) -> Runtime:
    """The Runtime of a command that computes nothing on a device (partition, clusters, report, flower import): this
    process's CPU, with the global options every build reads; --device does not apply to it."""
    return StoreRuntime(Runtime(**store_options(ctx)))


class Lazy:
    """A module imported on first attribute access: `fedl2p --help` and refused input need no torchvision,
    scikit-learn or matplotlib (measured: importing every stage module took 6 s of an 8.7 s start)."""

    def __init__(self, name: str):
        self._name, self._module = name, None

    def __getattr__(self, attr: str):
        if self._module is None:
            self._module = imports.load(self._name, imports.Why.OWN)
        return getattr(self._module, attr)

