"""One declaration per option: a config dataclass field says its type (choices as `Literal`), default, range and help
text (`opt(...)`). From it come the command-line option (cli/generate.py), the pipeline-file key, and the validation
here, which serves both and runs before anything is read or written."""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any

RANGE = "range"
INTERNAL = "internal"  # a field that is no option: not validated, not on the command line, not sent to a worker


class ConfigError(ValueError):
    """A config value of the wrong type or out of range (the CLI shows it as one line, exit 2)."""


def between(lo: float | None = None, hi: float | None = None, lo_open: bool = False, hi_open: bool = False) -> dict:
    """Field metadata: the accepted closed/open interval (None: unbounded on that side)."""
    return {RANGE: (lo, hi, lo_open, hi_open)}


POSITIVE = between(0, lo_open=True)        # > 0
AT_LEAST_1 = between(1)
NON_NEGATIVE = between(0)
FRACTION = between(0, 1, lo_open=True)     # (0, 1]
UNIT = between(0, 1)                       # [0, 1]
BELOW_1 = between(0, 1, hi_open=True)      # [0, 1)


@dataclasses.dataclass(frozen=True)
class Tag:
    """How an option names a variant (`opt(..., tag=Tag(...))`): when its value differs from the option's reference
    value (`reference_of`) and `when(owner)` holds (owner: the config holding the field), `word` joins the variant's
    name, placed by `rank` among the other words. `word`: a format of the value (`"binit{v:g}"`), a dict value -> word, or a function
    (value, owner) -> word."""
    word: str | dict[Any, str] | Callable[[Any, Any], str]
    rank: int
    when: Callable[[Any], bool] | None = None

    def spell(self, value: Any, owner: Any) -> str:
        if callable(self.word):
            return self.word(value, owner)
        if isinstance(self.word, dict):
            return self.word[value]
        return self.word.format(v=value)


def default_of(f: dataclasses.Field) -> Any:
    """The field's declared default (a fresh one for a default factory)."""
    if f.default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def reference_of(f: dataclasses.Field) -> Any:
    """The value ids and variant names are measured against: `opt(..., reference=...)` where the default moved away
    from it (the paper's setting, so every artifact id and variant name made before the move stays), else the
    declared default."""
    return f.metadata["reference"] if "reference" in f.metadata else default_of(f)


def stored(cls: type, values: dict) -> dict:
    """`values` (an artifact's stored settings, one config level) with the `identity_default` fields its id left out
    put back at their reference values: an artifact made while beta_init's default was 0.5 reads back as 0.5, never
    as today's default."""
    return {f.name: reference_of(f) for f in dataclasses.fields(cls)
            if f.metadata.get("identity_default") and f.name not in values} | values


def variant_words(cfg: Any, base: dict[str, Any] | None = None) -> list[str]:
    """The words naming `cfg`'s variant: one per tagged field (nested configs walked) whose value differs from its
    value in `base` (a preset's flat values), else from its reference value, in rank order."""
    found: list[tuple[int, str]] = []
    base = base or {}
    for obj, f, v in leaf_fields(cfg):
        ref = base[f.name] if f.name in base else reference_of(f)
        if (tag := f.metadata.get("tag")) and v != ref and (tag.when is None or tag.when(obj)):
            found.append((tag.rank, tag.spell(v, obj)))
    return [w for _, w in sorted(found, key=lambda rw: rw[0])]


def leaf_fields(cfg: Any) -> Iterator[tuple[Any, dataclasses.Field, Any]]:
    """(owner, field, value) of every field that is not itself a config, nested configs walked in field order."""
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            yield from leaf_fields(v)
        else:
            yield cfg, f, v


def spells_off(cfg: Any, base: dict[str, Any]) -> bool:
    """Whether every option of `cfg` whose value differs from `base` (a preset's flat values) names itself with a word
    of its own: tagged, its tag in force, and not at its reference value (whose word is missing, or another value's).
    Then the preset's name and those words name `cfg` without ambiguity."""
    for obj, f, v in leaf_fields(cfg):
        if f.name not in base or v == base[f.name]:
            continue
        tag = f.metadata.get("tag")
        if tag is None or v == reference_of(f) or (tag.when is not None and not tag.when(obj)):
            return False
    return True


def flat_value(cfg: Any, name: str) -> Any:
    """The value of field `name` in `cfg` or in one of its nested configs (the flat namespace of options)."""
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if f.name == name:
            return v
        if dataclasses.is_dataclass(v) and any(g.name == name for g in dataclasses.fields(v)):
            return getattr(v, name)
    raise KeyError(name)


def opt(default: Any, help: str = "", *meta: dict, **extra: Any) -> Any:
    """A config field: its default (a list or dict is copied for each instance), help text and metadata dicts (a
    range such as `POSITIVE`). Keywords: `option` (the flag's spelling when it is not --field-name), `short` (e.g.
    "-k"), `flag` (a bool without its --no- form), `envvar`, `path` (a str the CLI takes as a path), `required` (the
    command line must give it; the default is only the dataclass's), `cli=False`
    (not a command-line option), `identity_default` (left out of the artifact id at its default: an option added
    after artifacts existed), `tag` (a `Tag`: the word this option adds to a variant's name), `reference` (the value
    ids and names are measured against when the default is not it: see `reference_of`)."""
    md: dict = {"help": help}
    for m in meta:
        md |= m
    md |= extra
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=md)
    return dataclasses.field(default=default, metadata=md)


def choices(tp: Any) -> tuple[str, ...] | None:
    """The values of a `Literal[...]` annotation (None for any other type)."""
    return typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else None


def option_name(f: dataclasses.Field) -> str:
    """The command-line spelling: the field's own (`option` metadata, e.g. fixed_beta is --beta) or --field-name."""
    return f.metadata.get("option") or "--" + f.name.replace("_", "-")


def key_name(f: dataclasses.Field) -> str:
    """The pipeline-file spelling: the field name."""
    return f.name


def _describe(rng: tuple) -> str:
    lo, hi, lo_open, hi_open = rng
    if hi is None:
        return f"{'>' if lo_open else '>='} {lo:g}"
    if lo is None:
        return f"{'<' if hi_open else '<='} {hi:g}"
    return f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"


def _in_range(v: float, rng: tuple) -> bool:
    lo, hi, lo_open, hi_open = rng
    return ((lo is None or (v > lo if lo_open else v >= lo)) and (hi is None or (v < hi if hi_open else v <= hi)))


def _type_ok(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin is typing.Literal:  # a word an option takes besides its type's values (`--workers auto`)
        return value in typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        return isinstance(value, list) and all(_type_ok(v, item) for v in value)
    if origin is dict:  # per-domain settings: {name: value}
        key, item = typing.get_args(tp) or (Any, Any)
        return isinstance(value, dict) and all(_type_ok(k, key) and _type_ok(v, item) for k, v in value.items())
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:  # TOML `alpha = 1` is an int: accepted
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return isinstance(value, tp)
    return True


def _type_word(tp: Any) -> str:
    words = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    if typing.get_origin(tp) is typing.Literal:
        return " or ".join(repr(v) for v in typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_word(a) for a in typing.get_args(tp) if a is not type(None))
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        return f"a list of {_type_word(item).removeprefix('an ').removeprefix('a ')}s"
    if typing.get_origin(tp) is dict:
        _, item = typing.get_args(tp)
        return f"a table of domain = {_type_word(item).removeprefix('an ').removeprefix('a ')}"
    return words.get(tp, getattr(tp, "__name__", str(tp)))


def validate(cfg: Any, name: Callable[[dataclasses.Field], str] = option_name) -> None:
    """Raise ConfigError naming the first field whose value has the wrong type, is not finite, or is out of its
    declared range. Nested config dataclasses are validated too."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        if f.metadata.get(INTERNAL):
            continue
        value, tp = getattr(cfg, f.name), hints[f.name]
        allowed = choices(tp)
        if allowed is not None and value not in allowed:
            raise ConfigError(f"unknown {name(f)} '{value}'; choose one of: {', '.join(allowed)}")
        if not _type_ok(value, tp):
            raise ConfigError(f"{name(f)} must be {_type_word(tp)}, got {value!r}")
        if dataclasses.is_dataclass(value):
            validate(value, name)
            continue
        rng = f.metadata.get(RANGE)
        numbers = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else [value]
        for v in numbers:
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"{name(f)} must be a finite number, got {v}")
            if rng is not None and isinstance(v, (int, float)) and not _in_range(v, rng):
                raise ConfigError(f"{name(f)} must be {_describe(rng)}, got {v:g}")


def from_text(value: Any, tp: Any) -> Any:
    """A command-line string as a field of type `int | Literal[...]` holds it: digits become the integer, any other
    word stays as it is (validation names the option if it is not one of the words)."""
    if isinstance(value, str) and int in typing.get_args(tp):
        try:
            return int(value)
        except ValueError:
            return value
    return value


def flat_fields(cls: type) -> list[dataclasses.Field]:
    """A config's fields with each nested config's fields in its place, inherited fields (a shared base
    config's) last: the options of one command or section, in --help order."""
    return [f for f, _ in _flat(cls)]


def flat_types(cls: type) -> dict[str, Any]:
    """{field name: its resolved type annotation} over `flat_fields(cls)`."""
    return {f.name: tp for f, tp in _flat(cls)}


def _flat(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(cls)
    inherited = {f.name for base in cls.__mro__[1:] if dataclasses.is_dataclass(base) for f in dataclasses.fields(base)}
    fields = dataclasses.fields(cls)
    out = []
    for f in [f for f in fields if f.name not in inherited] + [f for f in fields if f.name in inherited]:
        tp = hints[f.name]
        out += _flat(tp) if isinstance(tp, type) and dataclasses.is_dataclass(tp) else [(f, tp)]
    return out


def from_flat(cls: type, values: dict) -> Any:
    """Build `cls` from a flat {field name: value} (nested configs' fields among them); absent fields keep their
    defaults."""
    hints, kw = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            kw[f.name] = from_flat(hints[f.name], values)
        elif f.name in values:
            kw[f.name] = values[f.name]
    return cls(**kw)
