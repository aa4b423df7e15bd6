"""A pFL system's own options (`PFLSystem.Options`): `--options name=value,...` or a `[[pfl]]` table's `options`,
checked against the dataclass the system declares. Values arrive as strings from the command line and as TOML values
from a pipeline file or a stored config; each becomes its field's type."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from ...errors import FedL2PError

_TYPES = {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string"}


def parse(cls: type | None, values: dict[str, Any], algo: str) -> Any:
    """`values` as an instance of `cls`; None when `cls` is None and nothing was given."""
    if cls is None:
        if values:
            raise FedL2PError(f"--options: pFL system '{algo}' takes no options, got '{next(iter(values))}'")
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in values if k not in fields]
    if unknown:
        raise FedL2PError(f"--options: pFL system '{algo}' has no option '{unknown[0]}' (its options: "
                          f"{', '.join(fields) or 'none'})")
    return cls(**{k: _value(k, fields[k], v) for k, v in values.items()})


def _value(name: str, tp: type, value: Any) -> Any:
    if tp not in _TYPES:
        raise FedL2PError(f"--options: option '{name}' is declared {tp}; a system's options are bool, int, float or str")
    try:
        if tp is bool:
            return _bool(value)
        if tp is int and isinstance(value, (float, bool)):
            raise ValueError
        return tp(value)
    except (TypeError, ValueError):
        raise FedL2PError(f"--options: {name} must be {_TYPES[tp]}, got {value!r}") from None


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError


def as_record(options: Any) -> dict[str, Any]:
    """The options an artifact's id holds: every field, defaults included (a default changed later is a new id)."""
    return dataclasses.asdict(options)
