"""`--help` that fits a terminal: one line per option (what it does, its unit), Rich markup in help shown as text,
no value placeholder on a flag, and `fedl2p --version`."""

from __future__ import annotations

import re

from fedl2p_cli import __version__
from fedl2p_cli.cli import reference
from fedl2p_cli.cli.main import run_cli

LONGEST = 160  # characters of one option's help, without the plugin lists a plugin adds


def every_option(path: list[str], cmd) -> list[tuple[str, str, str]]:
    out = [(" ".join(path), p.opts[0] if p.opts else p.name, p.help or "") for p in cmd.params if getattr(p, "help", None)]
    if hasattr(cmd, "list_commands"):
        for name in cmd.list_commands(cmd.context_class(cmd)):
            out += every_option(path + [name], reference._sub(cmd, name))
    return out


def test_every_option_has_a_one_line_help():
    options = every_option(["fedl2p"], reference._root())
    assert len(options) > 150  # the scan reached every command
    long = [f"{where} {name}: {len(text)} characters" for where, name, text in options if len(text) > LONGEST]
    assert not long, "move the reasons to the docs and point there:\n" + "\n".join(long)


def help_text(capsys, monkeypatch, *args: str) -> str:
    monkeypatch.setenv("COLUMNS", "200")
    capsys.readouterr()
    assert run_cli([*args, "--help"]) == 0
    return capsys.readouterr().out


def test_help_shows_brackets_as_text_and_no_placeholder_on_a_flag(capsys, monkeypatch):
    for command in (["pretrain"], ["meta-train"]):
        text = help_text(capsys, monkeypatch, *command)
        assert "fedl2p[flower]" in re.sub(r"\s+", "", text), f"{command}: Rich took [flower] for markup"
        assert "<bool>" not in text, f"{command}: a flag is shown as taking a value"
        assert re.search(r"--force\s+Rebuild", text), f"{command}: --force's help is not beside it"
    assert "<bool>" not in help_text(capsys, monkeypatch)


def test_version(capsys):
    assert run_cli(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"fedl2p {__version__}"
