"""`--workers auto` (pretrain, meta-train, a pipeline file's `workers`): one worker per free core, resolved once when
the Runtime is made; any other word is one line naming the option."""

from __future__ import annotations

import os

import pytest

from fedl2p_cli import runtime as rt_mod
from fedl2p_cli.cli.main import run_cli
from fedl2p_cli.core.config import validate
from fedl2p_cli.runtime import Runtime, free_cores


@pytest.mark.parametrize("cores, load, want", [(8, 0.2, 8), (8, 2.6, 5), (8, 30.0, 1), (1, 0.0, 1)])
def test_free_cores_are_the_usable_ones_less_the_load(monkeypatch, cores, load, want):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0), raising=False)
    assert free_cores() == want


def test_auto_is_resolved_to_a_number_once(monkeypatch):
    monkeypatch.setattr(rt_mod, "free_cores", lambda: 3)
    rt = Runtime(workers="auto")
    validate(rt)
    assert rt.workers == 3 and rt.to_dict()["workers"] == 3  # a worker process receives the number
    assert Runtime().replace(workers="auto").workers == 3  # a pipeline section's `workers = "auto"`
    assert Runtime(workers=2).workers == 2


def run(capsys, monkeypatch, store, *args):
    monkeypatch.setenv("FEDL2P_STORE", str(store))
    capsys.readouterr()
    code = run_cli([str(a) for a in args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("value", ["many", "2.5", "0"])
def test_a_bad_workers_value_is_one_line_naming_the_option(tmp_path, capsys, monkeypatch, value):
    store = tmp_path / "store"
    code, err = run(capsys, monkeypatch, store, "meta-train", "--workers", value)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--workers must be" in err, err
    assert not store.exists()


def test_the_command_line_takes_auto_and_numbers(tmp_path, capsys, monkeypatch):
    """Accepted: the command goes on to what it misses (no partition in an empty store), not to --workers."""
    for value in ("auto", "2"):
        code, err = run(capsys, monkeypatch, tmp_path / "store", "pretrain", "--workers", value)
        assert code == 2 and "--workers" not in err and "partition" in err, err


def test_a_pipeline_file_s_bad_workers_is_one_line(tmp_path, capsys, monkeypatch):
    f = tmp_path / "p.toml"
    f.write_text('[partition]\n[pretrain]\nworkers = "many"\n')
    code, err = run(capsys, monkeypatch, tmp_path / "store", "run", f)
    assert code == 2 and "[pretrain] workers must be an integer or 'auto'" in err, err
