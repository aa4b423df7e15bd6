"""Pipeline files: the shipped ones by name, `extends` chains resolved into one table, and that table written back
as one self-contained TOML file (`fedl2p run --show`)."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any

from ..errors import FedL2PError

_PACKAGE = Path(__file__).resolve().parent.parent
# the shipped pipelines: pipelines/ at the top of a clone, installed by the wheel as the package's data folder
SHIPPED = next((p for p in (_PACKAGE / "pipelines", _PACKAGE.parent / "pipelines") if p.is_dir()), _PACKAGE / "pipelines")
OWN_KEYS = ("name", "description")  # a file's own: never inherited from the file it extends


def resolve(path: Path) -> dict[str, Any]:
    """The file's table with its `extends` chain applied: the base first, then this file over it (tables merge key
    by key, at every depth; any other value, arrays and arrays of tables included, replaces the base's whole)."""
    return _resolve(path.resolve(), ())


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise FedL2PError(f"pipeline file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise FedL2PError(f"pipeline {path} is not valid TOML: {e}") from None


def _resolve(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    if path in chain:
        loop = " -> ".join(p.name for p in (*chain[chain.index(path):], path))
        raise FedL2PError(f"pipeline {chain[0]}: extends goes round in a circle ({loop})")
    own = _read(path)
    base = own.pop("extends", None)
    if base is None:
        return own
    if not isinstance(base, str) or not base:
        raise FedL2PError(f"pipeline {path}: extends must be a file name such as \"base.toml\", got {base!r}")
    base_path = (path.parent / base).resolve()
    if not base_path.is_file():
        raise FedL2PError(f"pipeline {path}: extends \"{base}\", which does not exist ({base_path})")
    inherited = {k: v for k, v in _resolve(base_path, (*chain, path)).items() if k not in OWN_KEYS}
    return merge(inherited, own)


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# -- shipped pipelines ----------------------------------------------------------------------------------------

def shipped() -> list[tuple[str, Path]]:
    """(name, file) of every shipped pipeline: its path under pipelines/ without .toml (`quickstart`,
    `bench/fs-0.1`). Files named _*.toml are bases other files extend, not pipelines of their own."""
    named = [(f.relative_to(SHIPPED).with_suffix("").as_posix(), f) for f in SHIPPED.rglob("*.toml")
             if not f.name.startswith("_")]
    return sorted(named, key=lambda nf: (nf[0].count("/"), nf[0]))  # top level first; a cell before its groups


def find(name_or_path: str) -> Path:
    """A file that exists is used as it is; otherwise a shipped pipeline's name (with or without .toml)."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    name = name_or_path.removesuffix(".toml")
    for n, f in shipped():
        if n == name:
            return f
    raise FedL2PError(f"pipeline file not found: {name_or_path} (nor is it a shipped pipeline's name: "
                      "`fedl2p run --list` lists them)")


def description(path: Path) -> str:
    d = resolve(path).get("description")
    return d if isinstance(d, str) else ""


def chain(path: Path) -> list[Path]:
    """The file and the files it extends, nearest first."""
    resolve(path)  # a missing file or a cycle is refused here, with its one line
    files = [path.resolve()]
    while isinstance(base := _read(files[-1]).get("extends"), str):
        files.append((files[-1].parent / base).resolve())
    return files


def _opening_comments(path: Path) -> list[str]:
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return lines


def show(path: Path) -> str:
    """The pipeline as one self-contained file: the opening comments of the file and of each file it extends, then
    every key its extends chain resolves to. Running the copy builds the same artifacts as running the original."""
    files = chain(path)
    head = _opening_comments(files[0])
    if len(files) > 1:
        head.append(f"# Written out by `fedl2p run --show` from {', '.join(f.name for f in files)} (extends resolved).")
        for f in files[1:]:
            head += [f"# From {f.name}:"] + _opening_comments(f)
    data = resolve(path)
    data.setdefault("name", path.stem)  # the copy keeps the original's name, whatever the copy's file is called
    return "\n".join(head) + ("\n" if head else "") + dumps(data)


# -- writing TOML ---------------------------------------------------------------------------------------------

def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # JSON's string escapes are TOML basic-string escapes
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }" if v else "{}"
    raise FedL2PError(f"cannot write {type(v).__name__} {v!r} as TOML")


def _key(k: str) -> str:
    bare = k and all(c.isascii() and (c.isalnum() or c in "-_") for c in k)
    return k if bare else json.dumps(k)


def _is_table_array(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def dumps(data: dict[str, Any]) -> str:
    """TOML for a pipeline's table: top-level values first, then a [section] per table (a [section.sub] per table
    inside it) and a [[section]] per entry of an array of tables; deeper tables are written inline."""
    lines = [f"{_key(k)} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict) and not _is_table_array(v)]
    for k, v in data.items():
        if isinstance(v, dict):
            lines += _table([k], v)
        elif _is_table_array(v):
            for entry in v:
                lines += ["", f"[[{_key(k)}]]", *(f"{_key(a)} = {_value(b)}" for a, b in entry.items())]
    return "\n".join(lines) + "\n"


def _table(path: list[str], table: dict[str, Any]) -> list[str]:
    subs = {k: v for k, v in table.items() if isinstance(v, dict) and len(path) == 1}
    lines = ["", f"[{'.'.join(_key(p) for p in path)}]"]
    lines += [f"{_key(k)} = {_value(v)}" for k, v in table.items() if k not in subs]
    for k, v in subs.items():
        lines += _table([*path, k], v)
    return lines
