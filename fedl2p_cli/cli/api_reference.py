"""The plugin API reference as Markdown, generated from `fedl2p_cli.api` itself
(`python -m fedl2p_cli.cli.api_reference > docs/reference/plugin-api.md`; a test checks that the page is current):
every name the module exports, in its order, with its signature and docstring, and a class's public methods."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import types
from typing import Any

HEADER = ("# Plugin API reference (`fedl2p_cli.api`)\n\nGenerated from the module by `python -m "
          "fedl2p_cli.cli.api_reference > docs/reference/plugin-api.md` (a test checks that it is current). "
          "[Bring your own model, dataset, method or pFL system](../guide/extending.md) shows it in use.\n")


def _annotation(a: Any) -> str:
    if a is inspect.Parameter.empty:
        return ""
    return a if isinstance(a, str) else inspect.formatannotation(a)


def _default(v: Any) -> str | None:
    if isinstance(v, type):
        return v.__name__
    return getattr(v, "__name__", None) if callable(v) and not dataclasses.is_dataclass(v) else repr(v)


_STARS: dict[Any, str] = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}


def signature(obj: Any, skip_self: bool = False) -> str:
    """`(name: type = default, ...) -> type`, annotations as written (strings are not evaluated)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    parts, star = [], False
    for i, p in enumerate(sig.parameters.values()):
        if skip_self and i == 0 and p.name == "self":
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        name = _STARS.get(p.kind, "") + p.name
        star |= p.kind is p.VAR_POSITIONAL
        ann = _annotation(p.annotation)
        text = f"{name}: {ann}" if ann else name
        if p.default is not inspect.Parameter.empty:
            text += f" = {_default(p.default)}"
        parts.append(text)
    ret = _annotation(sig.return_annotation)
    return f"({', '.join(parts)})" + (f" -> {ret}" if ret else "")


def _is_protocol(cls: type) -> bool:
    return bool(getattr(cls, "_is_protocol", False))


def _members(cls: type) -> list[str]:
    """A class's public methods and properties defined in it (not inherited), with their docstrings."""
    out = []
    for name, member in cls.__dict__.items():
        if name.startswith("_") and name != "__call__":
            continue
        if isinstance(member, property):
            out.append(f"- `{name}` (property)" + (f": {inspect.getdoc(member)}" if inspect.getdoc(member) else ""))
        elif inspect.isfunction(member):
            doc = inspect.cleandoc(member.__doc__) if member.__doc__ else ""  # its own, not an inherited one
            out.append(f"- `{name}{signature(member, skip_self=True)}`" + (f": {doc}" if doc else ""))
    return out


def _attributes(cls: type) -> list[str]:
    hints = cls.__dict__.get("__annotations__", {})
    return [f"- `{k}: {_annotation(v)}`" for k, v in hints.items() if not k.startswith("_")]


def _doc(obj: Any) -> str:
    """Its own docstring: a class's, not one inherited (Protocol's) or made up (a dataclass's signature)."""
    if isinstance(obj, type):
        doc = inspect.cleandoc(obj.__dict__.get("__doc__") or "")
        return "" if doc.startswith(f"{obj.__name__}(") else doc
    return inspect.getdoc(obj) or ""


def entry(name: str, obj: Any) -> str:
    doc = _doc(obj)
    if isinstance(obj, type):
        if _is_protocol(obj):
            head = f"### `{name}` (protocol)\n"
            body = [*_attributes(obj), *_members(obj)]
        else:
            kind = "dataclass" if dataclasses.is_dataclass(obj) else "class"
            head = f"### `{name}` ({kind})\n\n`{name}{signature(obj)}`\n"
            body = _members(obj)
        return head + (f"\n{doc}\n" if doc else "") + ("\n" + "\n".join(body) + "\n" if body else "")
    if isinstance(obj, types.GenericAlias):  # a type alias (Lambda): what it stands for, not its origin's docstring
        return f"### `{name}` (type)\n\n`{name} = {obj!r}`\n"
    if callable(obj):
        return f"### `{name}`\n\n`{name}{signature(obj)}`\n" + (f"\n{doc}\n" if doc else "")
    return f"### `{name}`\n\n`{name} = {obj!r}`\n"


def markdown() -> str:
    from .. import api
    out = [HEADER, (inspect.getdoc(api) or "") + "\n"]
    out += [entry(name, getattr(api, name)) for name in api.__all__]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
