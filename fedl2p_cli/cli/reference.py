"""The CLI reference as Markdown, generated from the Typer app itself (`python -m fedl2p_cli.cli.reference`).

`docs/reference/cli.md` is this module's output; a test regenerates it and compares, so the reference cannot drift
from the commands. Only what click (vendored or not) knows is used (names, help, defaults, flags), not Typer's rich rendering, so the
output is the same under every supported typer version.
"""

from __future__ import annotations

import sys

import typer

HEADER = ("# CLI reference\n\nGenerated from the command line itself by `python -m fedl2p_cli.cli.reference > "
          "docs/reference/cli.md` (a test checks that it is current). `fedl2p COMMAND --help` shows the same.\n")


def _root():
    from .generate import fill_plugin_help
    from .main import app
    root = typer.main.get_command(app)
    fill_plugin_help(root, {})  # the reference lists fedl2p's own pieces, whatever plugins this environment has
    return root


def _default(p) -> str:
    shown = getattr(p, "show_default", None)
    if isinstance(shown, str):
        return shown
    if p.default is None or (getattr(p, "is_flag", False) and p.default is False):
        return ""
    if isinstance(p.default, (list, tuple)):
        return ", ".join(map(str, p.default))
    return str(p.default)


def _names(p) -> str:
    if p.param_type_name == "argument":
        return f"`{(p.metavar or p.name).upper()}` (argument)"
    names = list(p.opts) + [f"/{o}" for o in p.secondary_opts]
    return " ".join(f"`{n}`" for n in names).replace(" `/", " / `")


def _cell(text: str) -> str:
    """One table cell: `|` escaped, and outside code spans `<x>` shown as text rather than read as HTML."""
    parts = " ".join((text or "").split()).replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def _env(p) -> str:
    env = getattr(p, "envvar", None)
    return f" (env `{env}`)" if isinstance(env, str) else ""


def command_md(path: list[str], cmd) -> list[str]:
    out = [f"## `{' '.join(path)}`", ""]
    help_text = (cmd.help or "").strip()
    if help_text:
        out += [_cell(help_text), ""]
    params = [p for p in cmd.params if p.name != "help" and not getattr(p, "hidden", False)]
    if params:
        out += ["| option | default | what it does |", "|---|---|---|"]
        out += [f"| {_names(p)} | {_cell(_default(p))} | {_cell(getattr(p, 'help', '') or '')}{_env(p)} |" for p in params]
        out.append("")
    if cmd.epilog:
        out += [_cell(cmd.epilog).replace("Example: ", "Example: `", 1) + "`", ""]
    return out


def _is_group(cmd) -> bool:  # typer vendors click in some versions: duck-typed, no click import
    return hasattr(cmd, "list_commands")


def _sub(cmd, name: str):
    return cmd.get_command(cmd.context_class(cmd), name)


def walk(path: list[str], cmd) -> list[str]:
    out = command_md(path, cmd)
    if _is_group(cmd):
        for name in cmd.list_commands(cmd.context_class(cmd)):
            out += walk(path + [name], _sub(cmd, name))
    return out


def markdown() -> str:
    return HEADER + "\n" + "\n".join(walk(["fedl2p"], _root())).rstrip() + "\n"


def options_of(words: list[str]) -> tuple[list[str], set[str]] | None:
    """The command path that `words` (after `fedl2p`) names and every option it accepts (its own and the global
    ones), or None if a word that must be a command is not one."""
    cmd = _root()
    known = {o for p in cmd.params for o in (*p.opts, *getattr(p, "secondary_opts", []))} | {"--help"}
    flags = {o for p in cmd.params if getattr(p, "is_flag", False) for o in p.opts} | {"--help"}  # take no value
    path: list[str] = []
    rest = list(words)
    while _is_group(cmd):
        while rest and rest[0].startswith("-"):  # global options before the command (and their values)
            opt = rest.pop(0)
            if opt.split("=")[0] not in known:
                return None
            if "=" not in opt and rest and not rest[0].startswith("-") and opt not in flags:
                rest.pop(0)
        if not rest:
            return path, known
        sub = _sub(cmd, rest[0])
        if sub is None:
            return None
        path.append(rest.pop(0))
        cmd = sub
    known |= {o for p in cmd.params for o in (*p.opts, *getattr(p, "secondary_opts", []))} | {"--help"}
    return path, known


if __name__ == "__main__":
    sys.stdout.write(markdown())
