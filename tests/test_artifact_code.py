"""Artifacts do not choose code (issue 51): a store someone else built may name any importable module as its model;
loading it imports nothing the user did not name (--model, --allow-import, a loaded plugin). And what a user types
reaches the terminal as typed, a failing command writes nothing (report -o included), a user's factory that raises is
one line naming --model and the factory."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap

import pytest

from fedl2p_cli.artifacts import artifact_id
from fedl2p_cli.cli.main import run_cli

EVIL = """
import pathlib
pathlib.Path(__file__).with_name("IMPORTED").write_text("ran")
def factory(in_channels, num_classes):
    raise ValueError("called")
"""
NETS = """
def raises(in_channels, num_classes):
    raise RuntimeError("kaboom")
"""


@pytest.fixture
def user(tmp_path, monkeypatch, capsys):
    """Modules on the path (one that records being imported), no module allowed yet, and a CLI runner."""
    mods = tmp_path / "mods"
    (mods / "tp_evil").mkdir(parents=True)
    (mods / "tp_evil" / "__init__.py").write_text(textwrap.dedent(EVIL))
    (mods / "tp_evil" / "sub.py").write_text(textwrap.dedent(EVIL))
    (mods / "tp_nets.py").write_text(textwrap.dedent(NETS))
    monkeypatch.syspath_prepend(str(mods))
    monkeypatch.delenv("FEDL2P_ALLOW_IMPORT", raising=False)
    monkeypatch.setenv("COLUMNS", "200")

    def cli(store, *args):
        monkeypatch.setenv("FEDL2P_STORE", str(store))
        capsys.readouterr()
        code = run_cli([str(a) for a in args])
        out, err = capsys.readouterr()
        return code, out, err
    yield mods, cli
    for m in ("tp_evil", "tp_evil.sub", "tp_nets"):
        sys.modules.pop(m, None)


def _edited_store(tiny_store, tmp_path, model: str) -> tuple:
    """A copy of the tiny store whose pretrain manifest names `model`, its id recomputed (as the trial did)."""
    root = tmp_path / "store"
    shutil.copytree(tiny_store["store"].root, root)
    old = tiny_store["pretrain"].id
    path = root / "pretrain" / old / "manifest.json"
    m = json.loads(path.read_text())
    m["config"]["model"] = model
    m["plugins"] = [{"module": model.partition(":")[0], "dist": "tp-evil", "version": "1.0", "model": model}]
    m["id"] = artifact_id("pretrain", m["config"], m["parents"])
    path.write_text(json.dumps(m))
    (root / "pretrain" / old).rename(root / "pretrain" / m["id"])
    return root, m["id"]


def test_an_artifact_naming_a_module_imports_nothing(user, tiny_store, tmp_path):
    mods, cli = user
    root, aid = _edited_store(tiny_store, tmp_path, "tp_evil.sub:factory")
    assert cli(root, "artifacts", "verify", "pretrain")[0] == 0  # its hashes and id hold: only its text is foreign
    code, _, err = cli(root, "stats", "--pretrain", aid)
    assert code == 2 and err == (f"error: artifact pretrain/{aid} asks for the model 'tp_evil.sub:factory': fedl2p imports "
                                 "no module an artifact names unless you do; if you trust it, add --allow-import "
                                 "tp_evil.sub (fedl2p --allow-import tp_evil.sub COMMAND, or "
                                 "FEDL2P_ALLOW_IMPORT=tp_evil.sub)\n")
    assert not (mods / "tp_evil" / "IMPORTED").exists() and "tp_evil" not in sys.modules
    code, _, err = cli(root, "--allow-import", "tp_evil.sub", "stats", "--pretrain", aid)  # the user names it
    assert (mods / "tp_evil" / "IMPORTED").exists()
    assert (code, err) == (2, "error: --model tp_evil.sub:factory: its factory factory() raised ValueError: called\n")


def test_a_factory_that_raises_is_one_line_naming_model_and_factory(user, tiny_store, tmp_path):
    _, cli = user
    root = tmp_path / "store"
    shutil.copytree(tiny_store["store"].root, root)
    code, _, err = cli(root, "pretrain", "--model", "tp_nets:raises", "--rounds", "1", "--from",
                       tiny_store["partition"].id)
    assert (code, err) == (2, "error: --model tp_nets:raises: its factory raises() raised RuntimeError: kaboom\n")


@pytest.mark.parametrize("args,shown", [
    (("pretrain", "--model", "no.such.module:factory"), "--model no.such.module:factory: cannot load it"),
    (("run", "nope:tada:.toml"), "pipeline file not found: nope:tada:.toml"),
    (("partition", "--dataset", "x:smile:[bold]y[/bold]"), "unknown dataset 'x:smile:[bold]y[/bold]'"),
])
def test_user_text_reaches_the_terminal_verbatim(user, tmp_path, args, shown):
    _, cli = user
    code, _, err = cli(tmp_path / "store", *args)
    assert code == 2 and shown in err


def test_report_to_a_missing_folder_writes_nothing(user, tiny_store, tmp_path):
    _, cli = user
    root = tmp_path / "store"
    shutil.copytree(tiny_store["store"].root, root)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    code, _, err = cli(root, "report", tiny_store["personalize"].id, "-o", tmp_path / "missing" / "r.html")
    assert code == 2 and err.startswith(f"error: --out {tmp_path / 'missing' / 'r.html'}: cannot write")
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
