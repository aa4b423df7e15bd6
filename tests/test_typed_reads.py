"""Typed reads (issue 80): a stage read by its `StageKey` (stages/rows.py) gets what the row's reader returns, typed,
so the type checker rejects a wrong attribute on a read. While `Read.value` was `Any` it passed every one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# a stage's reads as a stage module writes them: the right ones, then one wrong attribute per kind of read
SNIPPET = """\
from fedl2p_cli.stages.interface import Inputs
from fedl2p_cli.stages.rows import META_TRAIN, PARTITION, PERSONALIZE, PRETRAIN, STATS


def reads(inputs: Inputs) -> None:
    stats = inputs.get(STATS)
    print(stats.value.xi, stats.parent(PARTITION).value.pool(False), inputs.get(PERSONALIZE).value.learned)
    model, state = inputs.get(PRETRAIN).value
    print(inputs.at(META_TRAIN, "id").value.lam, inputs.made_from(STATS, PRETRAIN, "id", "model").value.x)
    print(stats.value.no_such_table_field)
    print(stats.parent(PARTITION).value.no_such_partition_field)
    print(inputs.at(META_TRAIN, "id").value.no_such_lambda_field)
"""
WRONG = {10: '"StatsTable" has no attribute "no_such_table_field"',
         11: '"Partition" has no attribute "no_such_partition_field"',
         12: '"MetaTrained" has no attribute "no_such_lambda_field"'}


def test_the_type_checker_rejects_a_wrong_attribute_on_a_read(tmp_path):
    pytest.importorskip("mypy", reason="mypy (the dev extra) is not installed")
    f = tmp_path / "reads.py"
    # its own last line: mypy's cache keys a module by its text, and would answer a text it checked before with that
    # run's errors under that run's path (CI runs the suite twice in one checkout)
    f.write_text(SNIPPET + f"# {tmp_path}\n")
    # the repository's settings (pyproject.toml) and cache: the package is read for its types, the snippet checked
    out = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", str(f)], cwd=REPO, capture_output=True,
                         text=True, timeout=600).stdout
    errors = {int(line.split(":")[1]): line for line in out.splitlines() if line.startswith(str(f))}
    assert sorted(errors) == sorted(WRONG), out
    assert all(WRONG[n] in errors[n] for n in WRONG), out
