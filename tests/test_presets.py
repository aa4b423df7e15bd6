"""--preset NAME: a named set of meta-train options, the options given beside it over it, on the command line and in
a pipeline file alike; an unknown name is one line naming the choices."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fedl2p_cli import plugins
from fedl2p_cli.cli import meta_train as cli_meta_train
from fedl2p_cli.cli.main import app, run_cli
from fedl2p_cli.configs import PRESETS, MetaTrainConfig
from fedl2p_cli.core.config import flat_value
from fedl2p_cli.errors import FedL2PError
from fedl2p_cli.stages import meta_train
from fedl2p_cli.stages.interface import SectionFile


class _Built(Exception):
    pass


def _cli_config(monkeypatch, *args: str) -> MetaTrainConfig:
    """The config `fedl2p meta-train ARGS` builds (the stage is not run)."""
    def execute(stage, cfg, *a, **k):
        raise _Built(cfg)
    monkeypatch.setattr(cli_meta_train.options, "execute", execute)
    r = CliRunner().invoke(app, ["meta-train", *args])
    assert isinstance(r.exception, _Built), r.output
    return r.exception.args[0]


def test_a_preset_on_the_command_line_takes_its_values_and_the_given_options_win(monkeypatch):
    assert _cli_config(monkeypatch) == MetaTrainConfig()  # the defaults: the learn preset
    fo = _cli_config(monkeypatch, "--preset", "fomaml")
    assert all(flat_value(fo, k) == v for k, v in PRESETS["fomaml"].items()) and fo.variant() == "fedl2p-fomaml-binit0.9"
    mixed = _cli_config(monkeypatch, "--preset", "fomaml", "--head", "log", "--beta-init", "0.5", "--rounds", "7")
    assert (mixed.meta.head, mixed.meta.beta_init, mixed.rounds, mixed.meta.lr_grad) == ("log", 0.5, 7, "last-step")


def test_an_unknown_preset_is_one_line_naming_the_choices(capsys):
    assert run_cli(["meta-train", "--preset", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown --preset 'nope'; choose one of: learn, fomaml, paper" in err and "Traceback" not in err


def test_a_preset_in_a_pipeline_table_takes_its_values_and_the_tables_keys_win():
    file = SectionFile({"meta-train": [{"preset": "paper", "seed": 2}, {"preset": "paper", "beta_init": 0.9}]},
                       "p.toml", plugins.build())
    a, b = (file.config(MetaTrainConfig, "meta-train", dict(t)) for t in file.tables("meta-train"))
    assert a == MetaTrainConfig.preset("paper", seed=2) and a.variant() == "fedl2p-seed2"
    assert b.meta.beta_init == 0.9 and b.meta.meta_grad == "ift"
    with pytest.raises(FedL2PError, match="unknown preset 'nope'; choose one of: learn, fomaml, paper"):
        file.config(MetaTrainConfig, "meta-train", {"preset": "nope"})
    assert meta_train.identity(a)["variant"] == "fedl2p-seed2"


def test_a_preset_names_a_variant_where_every_option_off_it_spells_a_word_of_its_own():
    learn = MetaTrainConfig.preset("learn")
    assert learn.variant() == "fedl2p-learn"
    assert MetaTrainConfig.preset("learn", lr_grad="unrolled", aggregator="equal-norm").variant() == \
        "fedl2p-learn-unroll-eqnorm"
    assert MetaTrainConfig.preset("learn", beta_init=0.9).variant() == "fedl2p-learn-binit0.9"
    # back at a reference value (--keep best, --lr-grad last-step) an option has no word: the name is spelled out
    for off in ({"keep": "best"}, {"lr_grad": "last-step"}):
        cfg = MetaTrainConfig.preset("learn", **off)
        assert "learn" not in cfg.variant().split("-") and cfg.variant() == cfg.spelled()
    assert learn.spelled() != learn.variant()  # the id hashes the spelled name, never the preset's word
