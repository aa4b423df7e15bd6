"""Docs that cannot drift: the CLI reference is generated from the app, and every `fedl2p ...` command line quoted in
the README and docs/ names commands and options that exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from fedl2p_cli.cli import api_reference, reference

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
STOP = {"|", "->", ">", ">>", "&&", ";", "#", "&"}
COMMAND = re.compile(r"(?:^|[\s/])fedl2p\s+(?=[-a-zA-Z])(.*)")


def test_cli_reference_is_current():
    committed = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert reference.markdown() == committed, "the CLI changed: run `make docs-reference` and commit docs/reference/cli.md"


def test_plugin_api_reference_is_current():
    committed = (ROOT / "docs" / "reference" / "plugin-api.md").read_text()
    assert api_reference.markdown() == committed, \
        "fedl2p_cli.api changed: run `make docs-reference` and commit docs/reference/plugin-api.md"


def test_the_api_exports_what_it_names_and_loads_torch_only_when_asked():
    import subprocess
    import sys
    code = ("import sys, fedl2p_cli.api as api; assert 'torch' not in sys.modules, 'api imported torch'; "
            "missing = [n for n in api.__all__ if getattr(api, n, None) is None]; assert not missing, missing")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


def quoted_commands() -> list[tuple[str, str]]:
    """(where, the words after `fedl2p`) for every command line in a code block or an inline code span."""
    out = []
    for f in DOCS:
        in_block, pending = False, ""
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if line.strip().startswith("```"):
                in_block = not in_block
                continue
            if in_block and line.rstrip().endswith("\\"):  # a command continued on the next line: check it whole
                pending += line.rstrip()[:-1] + " "
                continue
            line, pending = pending + line, ""
            spans = [line] if in_block else re.findall(r"`([^`]+)`", line)
            for span in spans:
                m = COMMAND.search(span)
                if m:
                    out.append((f"{f.relative_to(ROOT)}:{n}", m.group(1)))
    return out


def words_of(text: str) -> list[str]:
    text = text.replace("\\|", "|").split(" #")[0]
    try:
        raw = shlex.split(text)
    except ValueError:  # an unbalanced quote inside prose
        raw = text.split()
    words = []
    for w in raw:
        if w in STOP:
            break
        w = w.strip("[]")
        if w and w not in ("...", "…"):
            words.append(w)
    return words


def problems(where: str, text: str) -> list[str]:
    words = words_of(text)
    if not words or words[0].isupper():  # a placeholder such as `fedl2p COMMAND --help`
        return []
    found = reference.options_of(words)
    if found is None:
        return [f"{where}: `fedl2p {text}` names no command of the CLI"]
    _, known = found
    return [f"{where}: `fedl2p {text}`: unknown option {w}" for w in words
            if w.startswith("--") and w.split("=")[0] not in known]


def test_every_quoted_command_line_parses():
    quoted = quoted_commands()
    assert len(quoted) > 30  # the README and the guide quote many; finding none would mean the scan is broken
    bad = [p for where, text in quoted for p in problems(where, text)]
    assert not bad, "\n".join(bad)


def test_the_checker_catches_a_renamed_option_and_command():
    assert problems("x", "meta-train --meta-grad fomaml --rounds 3") == []
    assert problems("x", "meta-train --meta-gradient fomaml")
    assert problems("x", "meta-trian --rounds 3")
    assert problems("x", "--threads 2 personalize --unseen") == []
    assert problems("x", "flower import deploy/") == []


def test_the_readme_is_one_page_a_newcomer_reads_whole():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move detail to docs/"
