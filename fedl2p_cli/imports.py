"""The one place where a string becomes an import.

Every dynamic import in fedl2p goes through `load(target, why)`, and `why` says which rule admits the target. A reader
checks this file, not every caller, to know that artifact text never chooses what is imported:

- OWN: a module of fedl2p itself, named by fedl2p's own code (lazy imports, the stage table's commands);
- PLUGIN: a plugin the user installed (an entry point of the `fedl2p.plugins` group) or named (--plugin, FEDL2P_PLUGINS);
- REGISTERED: exactly the target a registered piece names (a pFL system's trainer): an artifact may pick a registered
  piece by name, never a module;
- ALLOWED: a module the user named on this command or allowed (--model, --allow-import, FEDL2P_ALLOW_IMPORT), or a
  loaded plugin's package: `models.guard` keeps that list;
- OPTIONAL: an optional dependency fedl2p knows by name (a tracker's library).

A target is `package.module` or `package.module:attribute`, with plain identifiers only (no dunder attribute, no
relative or empty part); anything else is refused before Python sees it.
"""

from __future__ import annotations

import enum
import importlib
import re
from collections.abc import Callable, Collection
from typing import Any

from .errors import FedL2PError

PACKAGE = "fedl2p_cli"
OPTIONAL_MODULES = frozenset({"tensorboard", "mlflow"})  # --track's libraries
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Why(enum.Enum):
    OWN = "fedl2p's own module"
    PLUGIN = "a plugin the user installed or named"
    REGISTERED = "a class a registered piece names"
    ALLOWED = "a module the user named or allowed"
    OPTIONAL = "an optional dependency"


class ImportRefused(FedL2PError):
    """A target no rule admits: nothing was imported."""


def within(module: str, package: str) -> bool:
    """`module` is `package` or one of its submodules (a prefix such as fedl2p_cli_evil is not)."""
    return module == package or module.startswith(package + ".")


def split(target: str) -> tuple[str, str]:
    """(module, attribute or "") of a well-formed target; ImportRefused for anything else."""
    module, sep, attr = target.partition(":")
    parts = module.split(".")
    if not all(_NAME.fullmatch(p) for p in parts) or (sep and not _NAME.fullmatch(attr)) or attr.startswith("__"):
        raise ImportRefused(f"refusing to import {target!r}: not a module name (package.module or package.module:name)")
    return module, attr


def admitted(target: str, why: Why, *, declared: Collection[str] = (), allowed: Callable[[str], bool] | None = None) -> bool:
    """Whether `why`'s rule admits `target`: `declared` is the plugin modules the user installed or named (PLUGIN) or
    the targets registered pieces name (REGISTERED); `allowed` is the user's allow-list (ALLOWED)."""
    module = target.partition(":")[0]
    if why is Why.OWN:
        return within(module, PACKAGE)
    if why is Why.PLUGIN:
        return module in declared
    if why is Why.REGISTERED:
        return target in declared
    if why is Why.ALLOWED:
        return allowed is not None and allowed(module)
    return module in OPTIONAL_MODULES


def load(target: str, why: Why, *, declared: Collection[str] = (), allowed: Callable[[str], bool] | None = None) -> Any:
    """The module `target` names (or its attribute after ':'), imported only if `why`'s rule admits it; ImportRefused
    naming the rule otherwise. Errors the module raises while importing propagate to the caller, which names them."""
    module, attr = split(target)
    if not admitted(target, why, declared=declared, allowed=allowed):
        raise ImportRefused(f"refusing to import {target!r}: it is not {why.value}")
    mod = importlib.import_module(module)
    return getattr(mod, attr) if attr else mod
