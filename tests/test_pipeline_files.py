"""Pipeline files that compose (`extends`), the shipped pipelines by name, and `fedl2p run --list / --show`."""

from __future__ import annotations

import json
import pathlib
import re
import tomllib

import pytest

from fedl2p_cli import plugins
from fedl2p_cli.cli.main import run_cli
from fedl2p_cli.stages import pipeline
from fedl2p_cli.stages import pipeline_files as pf


def typed(d: dict) -> str:
    """A table as text that tells 1000 from 1000.0: equal tables give equal artifact ids."""
    return json.dumps(d, sort_keys=True)


def test_extends_merges_tables_key_by_key_and_replaces_arrays(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "root.toml").write_text('name = "root"\ndescription = "the root"\n[partition]\ndataset = "digits"\n'
                                        'alpha = 1000\nclients = 10\n[pretrain]\nrounds = 5\n[pretrain.partition]\n'
                                        'dataset = "digits"\nclients = 8\n[[meta-train]]\nseed = 0\n[[meta-train]]\n'
                                        'seed = 1\n[personalize]\nseeds = [0, 1, 2]\n')
    (tmp_path / "sub" / "mid.toml").write_text('extends = "../root.toml"\npartition.alpha = 0.1\n'
                                               '[pretrain.partition]\nclients = 6\n')
    (tmp_path / "sub" / "leaf.toml").write_text('extends = "mid.toml"\n[[meta-train]]\nseed = 2\n'
                                                '[personalize]\nseeds = [0]\n')
    got = pf.resolve(tmp_path / "sub" / "leaf.toml")
    assert typed(got) == typed({  # name and description are each file's own; arrays replace, tables merge
        "partition": {"dataset": "digits", "alpha": 0.1, "clients": 10},
        "pretrain": {"rounds": 5, "partition": {"dataset": "digits", "clients": 6}},
        "meta-train": [{"seed": 2}], "personalize": {"seeds": [0]}})
    assert pipeline.load(tmp_path / "sub" / "leaf.toml").name == "leaf"


@pytest.mark.parametrize("case", ["cycle", "self", "missing", "not-a-string"])
def test_a_broken_extends_is_one_line_and_exit_2(tmp_path, capsys, case):
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text({"cycle": 'extends = "b.toml"\n', "self": 'extends = "a.toml"\n', "missing": 'extends = "nope.toml"\n',
                  "not-a-string": "extends = 3\n"}[case] + '[partition]\ndataset = "digits"\n[pretrain]\n')
    b.write_text('extends = "a.toml"\n')
    assert run_cli(["run", str(a), "--store", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "extends" in err.replace(str(tmp_path), ""), err
    if case in ("cycle", "self"):
        assert "circle" in err and (case == "self" or "a.toml -> b.toml -> a.toml" in err), err
    if case == "missing":
        assert 'extends "nope.toml", which does not exist' in err, err
    assert not (tmp_path / "store").exists()


def test_every_shipped_pipeline_is_listed_and_copies_out_whole(tmp_path, capsys):
    """--list names every shipped pipeline with its description (not the _*.toml bases); --show prints a file with no
    extends that resolves to the same table, so the copy builds the same artifacts."""
    shipped = pf.shipped()
    assert len(shipped) >= 40 and {"quickstart", "tiny", "bench/fs-0.1"} <= {n for n, _ in shipped}
    assert run_cli(["run", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == [n for n, _ in shipped]
    assert all(len(line.split(None, 1)) == 2 for line in listed)  # every one has its line of description
    assert not any(n.split("/")[-1].startswith("_") for n, _ in shipped)
    for name, f in shipped:
        assert run_cli(["run", "--show", name]) == 0
        text = capsys.readouterr().out
        copy = tmp_path / "copy.toml"
        copy.write_text(text)
        assert "extends" not in tomllib.loads(text)
        original = pf.resolve(f) | {"name": pf.resolve(f).get("name", f.stem)}
        assert typed(pf.resolve(copy)) == typed(original), name


def test_a_name_or_a_path(tmp_path, capsys):
    assert pf.find("quickstart") == pf.find("quickstart.toml") == pf.SHIPPED / "quickstart.toml"
    mine = tmp_path / "quickstart"  # a file that exists wins over the shipped name
    mine.write_text("")
    assert pf.find(str(mine)) == mine
    assert run_cli(["run", "no-such-pipeline"]) == 2
    assert "fedl2p run --list" in capsys.readouterr().err


def test_every_shipped_pipeline_passes_validation(tmp_path):
    """Every shipped pipeline (the paper's, the quickstart's, the benchmark's cells) resolves and passes the
    whole-file validation (keys, types, ranges) without any data."""
    for _, f in pf.shipped():
        pipeline.compile(pipeline.load(f, tmp_path / "store"), plugins.current())
    assert not (tmp_path / "store").exists()


def test_run_of_a_shown_copy_reuses_the_shipped_run(tmp_path, capsys):
    """`fedl2p run tiny`, then `fedl2p run --show tiny > my.toml; fedl2p run my.toml`: every artifact reused."""
    store = str(tmp_path / "store")
    assert run_cli(["run", "tiny", "--store", store]) == 0
    first = capsys.readouterr().out
    assert run_cli(["run", "--show", "tiny"]) == 0
    (tmp_path / "my.toml").write_text(capsys.readouterr().out)
    assert run_cli(["run", str(tmp_path / "my.toml"), "--store", store]) == 0
    second = capsys.readouterr().out
    ids = [set(re.findall(r"\b[0-9a-f]{12}\b", out)) for out in (first, second)]
    assert len(ids[0]) == 7 and ids[0] == ids[1] and "built" in first and "built" not in second

    # a report reads what the run recorded: the plugins a copy of the pipeline names need not be installed
    (tmp_path / "elsewhere.toml").write_text('plugins = ["fedl2p_no_such_plugin"]\n' + (tmp_path / "my.toml").read_text())
    assert run_cli(["run", str(tmp_path / "elsewhere.toml"), "--store", store]) == 2
    assert "fedl2p_no_such_plugin" in capsys.readouterr().err
    assert run_cli(["report", str(tmp_path / "elsewhere.toml"), "--store", store]) == 0
    page = capsys.readouterr().out
    assert run_cli(["report", "tiny", "--store", store]) == 0
    assert set(re.findall(r"\b[0-9a-f]{12}\b", page)) == set(re.findall(r"\b[0-9a-f]{12}\b", capsys.readouterr().out))
    (tmp_path / "store" / pipeline.PLANS).unlink()  # no record: the plan is compiled, which needs the plugin
    assert run_cli(["report", str(tmp_path / "elsewhere.toml"), "--store", store]) == 2


def test_a_stage_refusal_in_a_pipeline_names_the_key(tmp_path, capsys):
    """A stage's message about one of its options names the key of the file's section, not the command's option."""
    (tmp_path / "few.toml").write_text(f'extends = "{pf.SHIPPED / "tiny.toml"}"\n[partition]\nclients = 2\n')
    assert run_cli(["run", str(tmp_path / "few.toml"), "--store", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert "[partition]" in err and "got clients 2" in err and "--clients" not in err, err


def test_a_clone_reads_the_shipped_pipelines_from_the_top_level_folder():
    """The repository keeps pipelines/ at its top level (the wheel installs it as fedl2p_cli/pipelines)."""
    root = pathlib.Path(__file__).resolve().parent.parent
    assert root / "pipelines" == pf.SHIPPED and not (root / "fedl2p_cli" / "pipelines").exists()
