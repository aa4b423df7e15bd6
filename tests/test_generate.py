"""Options declared once (fedl2p_cli/configs.py, core/settings.py): every command-line option of a stage is a field
of its config, with the field's help and default, and a new option is one field."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from dataclasses import dataclass
from typing import Literal

import pytest
import typer
from typer.testing import CliRunner

from fedl2p_cli import configs
from fedl2p_cli.cli.generate import config_command
from fedl2p_cli.cli.main import app
from fedl2p_cli.core.config import ConfigError, flat_fields, opt, option_name, validate

COMMANDS = {"partition": configs.PartitionConfig, "pretrain": configs.PretrainConfig, "stats": configs.StatsConfig,
            "meta-train": configs.MetaTrainConfig, "pfl-train": configs.PFLConfig,
            "personalize": configs.PersonalizeConfig}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_field_is_an_option_with_its_help_and_default(command):
    cmd = typer.main.get_command(app).commands[command]
    params = {p.name: p for p in cmd.params}
    fields = [f for f in flat_fields(COMMANDS[command]) if f.metadata.get("cli", True)]
    assert len(fields) > 0
    for f in fields:
        p = params[f.name]
        assert option_name(f) in p.opts, (f.name, p.opts)
        assert p.help == f.metadata["help"] and p.help, f.name
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        want = ",".join(map(str, default)) if isinstance(default, list) and default else (None if default in ([], {}) else default)
        assert p.default == want, (f.name, p.default, want)


def test_run_config_takes_meta_train_s_options_but_those_a_deployment_cannot_use():
    params = {p.name for p in typer.main.get_command(app).commands["flower"].commands["run-config"].params}
    meta = {f.name for f in flat_fields(configs.MetaTrainConfig)}
    assert meta - params == {"local", "input_norm"}
    # of the runtime options, the failure policy: the sites compute on their own devices, without local workers
    assert {"round_timeout", "min_answers", "round_retries"} <= params
    assert not {"workers", "engine", "gpus_per_client"} & params


def test_the_generated_command_line_does_not_import_torch():
    """Every command's options are generated from configs that need no torch: `fedl2p --help` stays fast."""
    code = ("import sys, typer; from fedl2p_cli.cli.main import app, run_cli; typer.main.get_command(app); "
            "run_cli(['--help']); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout[-500:] + out.stderr[-500:]


@dataclass(kw_only=True)
class Toy:
    rounds: int = opt(3, "Rounds.", {"range": (1, None, False, False)})
    fast: bool = opt(False, "A boolean added in one place.", flag=True)
    mode: Literal["a", "b"] = opt("a", "a | b.")
    seeds: list[int] = opt([0, 1], "Seeds.")


def test_a_new_option_is_one_field():
    """A config with a boolean, a choice and a list gets its command's options, typed and checked, from the fields
    alone."""
    got = []
    toy = typer.Typer()

    @toy.command()
    @config_command(Toy)
    def run(cfg: Toy) -> None:
        validate(cfg)
        got.append(cfg)

    runner = CliRunner()
    assert runner.invoke(toy, ["--fast", "--mode", "b", "--seeds", "4,5"]).exit_code == 0
    assert got[-1] == Toy(fast=True, mode="b", seeds=[4, 5])
    assert runner.invoke(toy, []).exit_code == 0 and got[-1] == Toy()
    r = runner.invoke(toy, ["--mode", "c"])
    assert isinstance(r.exception, ConfigError) and "unknown --mode 'c'; choose one of: a, b" in str(r.exception)
    r = runner.invoke(toy, ["--rounds", "0"])
    assert isinstance(r.exception, ConfigError) and "--rounds must be >= 1" in str(r.exception)
    assert "A boolean added in one place." in runner.invoke(toy, ["--help"]).output


def test_every_kind_a_plugin_adds_is_named_in_the_help_of_its_option():
    """Each kind of piece has its option's `<plugin-KIND>` mark: a plugin's meta-gradient is listed in --meta-grad's
    help and its executor in --engine's, as its model is in --model's."""
    from fedl2p_cli.catalog import KINDS
    from fedl2p_cli.cli.generate import PLUGIN_KINDS, fill_plugin_help
    assert set(PLUGIN_KINDS.values()) == set(KINDS)
    root = typer.main.get_command(app)
    fill_plugin_help(root, {k: [f"my-{k} (mine)"] for k in KINDS})
    helps = {(c, p.name): p.help for c in ("pretrain", "meta-train") for p in root.commands[c].params}
    assert "From plugins: my-meta-grad (mine)." in helps[("meta-train", "meta_grad")]
    assert "From plugins: my-executor (mine)." in helps[("meta-train", "engine")]
    assert "From plugins: my-meta-head (mine)." in helps[("meta-train", "head")]
    assert "From plugins: my-server-step (mine)." in helps[("meta-train", "meta_opt")]
    assert "From plugins: my-model (mine)." in helps[("pretrain", "model")]


def hand_written_options(cli_dir) -> list[str]:
    """The typer.Option / typer.Argument calls written in cli/ (the generator's own call excluded): the options not
    generated from a config dataclass."""
    import ast
    out = []
    for path in sorted(cli_dir.glob("*.py")):
        if path.name == "generate.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("typer.Option", "typer.Argument"):
                out.append(f"{path.name}:{node.lineno}")
    return out


def test_few_options_are_written_by_hand(tmp_path):
    """Options come from config dataclasses (opt(...)); the few written by hand in cli/ (a parent artifact's id, the
    global options, positional arguments), each shared option declared once in cli/options.py, stay at most 40."""
    from pathlib import Path
    found = hand_written_options(Path(configs.__file__).parent / "cli")
    assert 0 < len(found) <= 40, found
    (tmp_path / "x.py").write_text("import typer\ndef f(a=typer.Option(1), b=typer.Argument(None)):\n    pass\n")
    assert hand_written_options(tmp_path) == ["x.py:2", "x.py:2"]
