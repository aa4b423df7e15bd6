"""Command-line options generated from the config dataclasses (core/config.py `opt`): a field's name, type, default
and help text are declared once, and every command that takes that config gets the same option."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import typer

from ..core.config import choices, flat_fields, flat_types, from_flat, from_text, option_name
from ..runtime import Runtime
from . import options
from .options import StoreRuntime


def _cli_type(tp: Any, f: dataclasses.Field) -> Any:
    """What the command line takes: lists and per-domain tables as one comma-separated string, choices as a string
    (checked with the config, so a bad value is one line naming the option), a `path` field as a Path."""
    if f.metadata.get("path"):
        return Path if f.metadata.get("required") else Optional[Path]  # noqa: UP045 -- a value built for typer at run time, not an annotation
    inner = _unwrap(tp)
    if typing.get_origin(inner) in (list, dict):
        return Optional[str]  # noqa: UP045 -- as above
    if choices(inner) is not None or typing.get_origin(inner) in (typing.Union, types.UnionType):
        return str  # choices, or a number or a word (`--workers auto`): checked with the config
    return Optional[inner] if inner is not tp else tp  # noqa: UP045 -- as above (inner: any type the config declares)


def _default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[operator]  # then it has a factory


def _cli_default(f: dataclasses.Field) -> Any:
    value = _default(f)
    if isinstance(value, list):
        return ",".join(str(v) for v in value) if value else None
    if isinstance(value, dict):
        return None
    return value


def _option(f: dataclasses.Field) -> typer.models.OptionInfo:
    """Typer's option for a field. Spelled out only where needed: otherwise Typer derives --field-name (and, for a
    bool that is not a `flag`, its --no- form)."""
    md = f.metadata
    decls = [option_name(f)] if "option" in md or md.get("flag") or "short" in md else []
    decls += [md["short"]] if "short" in md else []
    kw = {"envvar": md["envvar"]} if "envvar" in md else {}
    default = ... if md.get("required") else _cli_default(f)  # required: the command line must give it
    return typer.Option(default, *decls, help=md.get("help") or None, **kw)


def parameters(cls: type, only: tuple[str, ...] | None = None, skip: tuple[str, ...] = ()) -> list[inspect.Parameter]:
    """One keyword parameter per command-line field of `cls` (nested configs flattened), in declaration order."""
    hints = flat_types(cls)
    return [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=_option(f), annotation=_cli_type(hints[f.name], f))
            for f in flat_fields(cls) if f.metadata.get("cli", True) and f.name not in skip and (only is None or f.name in only)]


def _unwrap(tp: Any) -> Any:
    """`X | None` -> X."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def _parse(f: dataclasses.Field, tp: Any, value: Any) -> Any:
    """A command-line value as the config holds it."""
    tp = _unwrap(tp)
    origin = typing.get_origin(tp)
    if f.metadata.get("path"):
        return None if value is None else str(value)
    if origin is list:
        (item,) = typing.get_args(tp)
        items = options.typed_list(value, item if item in (int, float) else str, option_name(f))
        return _default(f) if items is None else items
    if origin is dict:  # values of a union type (a system's --options) stay strings: the system types them
        item = typing.get_args(tp)[1]
        return options.domain_values(value, item if isinstance(item, type) else str, option_name(f))
    return value


def build(cls: type, values: dict) -> Any:
    """The config from a command's parsed options."""
    hints = flat_types(cls)
    fields = {f.name: f for f in flat_fields(cls)}
    return from_flat(cls, {k: _parse(fields[k], hints[k], v) for k, v in values.items() if k in fields})


CONTEXT = "typer_context"  # the parameter through which a command reads the global options (--device, ...)
PRESET = "preset"


def _preset_option(cls: type) -> list[inspect.Parameter]:
    """`--preset NAME` for a config with named sets of options (`cls.PRESETS`), else none."""
    presets = getattr(cls, "PRESETS", None)
    if not presets:
        return []
    first = next(iter(presets))
    text = (f"A named set of options, given options over it: {' | '.join(presets)} (the defaults are {first}'s). "
            "See docs/method/fedl2p.md#presets.")
    return [inspect.Parameter(PRESET, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],  # noqa: UP045
                              default=typer.Option(None, "--preset", help=text))]


def with_preset(cls: type, name: str | None, values: dict, ctx: Any) -> dict:
    """`values` (a command's parsed options) with the preset's value for every option it names that the command line
    did not give (a default, not typed)."""
    if name is None:
        return values
    from ..core.config import ConfigError
    presets = cls.PRESETS  # type: ignore[attr-defined]  # _preset_option checked it
    if name not in presets:
        raise ConfigError(f"unknown --preset '{name}'; choose one of: {', '.join(presets)}")
    return values | {k: v for k, v in presets[name].items() if _defaulted(ctx, k)}


def _defaulted(ctx: Any, name: str) -> bool:
    """Whether option `name` took its default (not typed, no environment variable). By the source's name: typer may
    bring a click of its own, whose ParameterSource is another class than `click.core`'s."""
    source = ctx.get_parameter_source(name)
    return source is None or source.name in ("DEFAULT", "DEFAULT_MAP")


def config_command(cls: type, only: tuple[str, ...] | None = None, skip: tuple[str, ...] = (),
                   runtime: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Decorate `body(cfg, **rest)` or `body(cfg, rt, **rest)`: the command's options are `cls`'s fields (or `only`
    those, less `skip`), then the `runtime` options (fields of Runtime: where and how it runs, never part of an id),
    then body's own parameters (artifact ids, --force, --store). `rt`, when body takes it, is the command's Runtime:
    the global options (`fedl2p --device ...`) with this command's runtime options; a body whose `rt` is annotated
    `StoreRuntime` computes on no device and gets `options.store_runtime`."""
    def wrap(body: Callable) -> Callable:
        own = list(inspect.signature(body).parameters.values())[1:]
        wants_rt = bool(own) and own[0].name == "rt"
        store_only = wants_rt and own[0].annotation in (StoreRuntime, "StoreRuntime")
        own = own[1:] if wants_rt else own
        generated = parameters(cls, only, skip)
        names = {p.name for p in generated}
        run_opts = parameters(Runtime, only=runtime) if runtime else []
        run_types = typing.get_type_hints(Runtime)
        hints = typing.get_type_hints(body)
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints.get(p.name, p.annotation)) for p in own]

        presets = _preset_option(cls)

        def command(**kw: Any) -> Any:
            values = {k: kw.pop(k) for k in list(kw) if k in names}
            if presets:
                values = with_preset(cls, kw.pop(PRESET), values, kw[CONTEXT])
            cfg = build(cls, values)
            ctx, run_kw = kw.pop(CONTEXT), {k: from_text(kw.pop(k), run_types[k]) for k in runtime}
            if not wants_rt:
                return body(cfg, **kw)
            return body(cfg, options.store_runtime(ctx) if store_only else options.runtime(ctx, **run_kw), **kw)

        ctx = inspect.Parameter(CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)  # Typer fills it in
        command.__signature__ = inspect.Signature(generated + presets + run_opts + own + [ctx])  # type: ignore[attr-defined]  # what Typer reads
        command.__name__, command.__doc__, command.__module__ = body.__name__, body.__doc__, body.__module__
        return command
    return wrap


PLUGIN_KINDS = {"<plugin-models>": "model", "<plugin-datasets>": "dataset", "<plugin-pretrain-algos>": "pretrain-algo",
                "<plugin-systems>": "system", "<plugin-methods>": "method", "<plugin-meta-grads>": "meta-grad",
                "<plugin-executors>": "executor", "<plugin-meta-heads>": "meta-head",
                "<plugin-server-steps>": "server-step", "<plugin-lr-grads>": "lr-grad",
                "<plugin-meta-inputs>": "meta-inputs", "<plugin-meta-signals>": "meta-signal",
                "<plugin-aggregators>": "aggregator"}


def load_pieces(ctx) -> None:
    """Load the built-in pieces and the plugins (`--plugin`, entry points), and name them in the stages' help."""
    from .. import plugins
    from .render import plugin_notes
    plugins.load(ctx.find_root().obj["plugin"])
    plugin_notes()
    fill_plugin_help(ctx.find_root().command, plugins.current().pieces())


def fill_plugin_help(cmd: Any, pieces: dict[str, list[str]]) -> None:
    """Each option's `<plugin-KIND>` mark in its help becomes the plugins' pieces of that kind ({kind: ["name (plugin)",
    ...]}), or nothing: a plugin's model, dataset or method is listed where the built-in ones are."""
    for param in getattr(cmd, "params", []):
        text = getattr(param, "help", None)
        for mark, kind in PLUGIN_KINDS.items():
            if text and mark in text:
                text = text.replace(mark, f" From plugins: {', '.join(pieces[kind])}." if pieces.get(kind) else "")
        if text is not None:
            param.help = text
    for sub in getattr(cmd, "commands", {}).values():
        fill_plugin_help(sub, pieces)
