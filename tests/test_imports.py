"""The one gate for dynamic imports (fedl2p_cli/imports.py), tried as an attacker would: artifact text, a pipeline
file or a wire message that names a module gets it imported only through a rule that admits it, and no other module of
the package turns a string into an import."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from fedl2p_cli import imports
from fedl2p_cli.imports import ImportRefused, Why

PACKAGE = Path(imports.__file__).parent


@pytest.mark.parametrize("target", [
    "os:system", "subprocess", "fedl2p_cli_evil.mod", "fedl2p_clix:thing", "builtins:eval",
    "fedl2p_cli.api:__class__", "fedl2p_cli.api:__builtins__", "fedl2p_cli..api", ".api", "fedl2p_cli.api:",
    "fedl2p_cli.api:a.b", "fedl2p_cli/api", "fedl2p_cli.api:x y", "fedl2p_cli. api", "", ":", "fedl2p_cli.api::x",
    "fedl2p_cli\x00.api", "fedl2p_cli.\u0430pi",  # a NUL, a Cyrillic 'a'
])
def test_own_admits_fedl2p_modules_only(target):
    before = set(sys.modules)
    with pytest.raises(ImportRefused):
        imports.load(target, Why.OWN)
    assert not {m for m in set(sys.modules) - before if not m.startswith("fedl2p_cli")}  # nothing else imported


def test_each_rule_admits_what_it_names_and_nothing_else():
    assert imports.load("fedl2p_cli.errors:FedL2PError", Why.OWN).__name__ == "FedL2PError"
    with pytest.raises(ImportRefused, match="not an optional dependency"):
        imports.load("os", Why.OPTIONAL)
    with pytest.raises(ImportRefused, match="not a plugin"):
        imports.load("json", Why.PLUGIN, declared=["jsonx"])
    assert imports.load("json", Why.PLUGIN, declared=["json"]).__name__ == "json"
    with pytest.raises(ImportRefused, match="not a class a registered piece names"):
        imports.load("json:loads", Why.REGISTERED, declared=["json:dumps"])
    with pytest.raises(ImportRefused, match="not a module the user named"):
        imports.load("json:loads", Why.ALLOWED)
    with pytest.raises(ImportRefused):
        imports.load("json:loads", Why.ALLOWED, allowed=lambda m: m == "jsonx")
    assert imports.load("json:loads", Why.ALLOWED, allowed=lambda m: m == "json") is __import__("json").loads


def test_a_model_an_artifact_names_is_not_imported_unless_allowed(tmp_path):
    """`--model package.module:factory` reaches the gate as ALLOWED: refused (one line naming --allow-import) unless
    the user allowed its module."""
    from fedl2p_cli import plugins
    from fedl2p_cli.errors import FedL2PError
    from fedl2p_cli.models import registry
    assert "this_module_does_not_exist_x" not in sys.modules
    with pytest.raises(FedL2PError, match="--allow-import json"):
        registry.spec("json:loads", plugins.build())


def test_no_other_module_turns_a_string_into_an_import():
    """importlib.import_module, __import__, EntryPoint.load and importlib.util.module_from_spec appear in imports.py
    only (importlib.util.find_spec, which imports nothing for a top-level name, is plugins.importable's)."""
    bad = []
    for f in sorted(PACKAGE.rglob("*.py")):
        if f == PACKAGE / "imports.py":
            continue
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
                if name in ("import_module", "__import__", "module_from_spec", "exec_module") or (
                        name == "load" and isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name)
                        and fn.value.id in ("ep", "entry_point", "entry")):
                    bad.append(f"{f.relative_to(PACKAGE.parent)}:{node.lineno} {name}")
    assert not bad, bad
