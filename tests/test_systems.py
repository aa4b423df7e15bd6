"""A new personalised-FL system is one class and one registration: tests/toy_system.py, registered here only, is
trained by `pfl-train`'s stage through the Runtime's executor (this process or `--workers` processes, the same
bytes), stored, reloaded and evaluated by `personalize` beside the FT baselines. A system written against API 1's
module protocol (tests/toy_system_v1.py) still trains, in this process, and its loading notes how to move it."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch

from fedl2p_cli import methods, plugins
from fedl2p_cli.artifacts import Store
from fedl2p_cli.configs import PFLConfig
from fedl2p_cli.errors import FedL2PError
from fedl2p_cli.runtime import Runtime
from fedl2p_cli.stages import partition, personalize, pfl

from . import toy_system_v1
from .helpers import execute


def register(registry):
    """This module is the plugin (worker processes load it by name)."""
    registry.add_system(methods.System("toy-fedavg", "Toy FedAvg", trainer="tests.toy_system:ToyFedAvg"))
    registry.add_system(methods.System("toy-fedavg-v1", "Toy FedAvg v1", trainer="tests.toy_system_v1"))
    registry.add_system(methods.System("toy-scaled", "Toy scaled", trainer="tests.toy_system:ToyFedAvgScaled"))


def cfg_of(algo: str) -> PFLConfig:
    return PFLConfig(algo=algo, rounds=2, fraction=0.5, local_epochs=1, batch_size=16, lr=0.05)


@pytest.fixture
def store(tiny_store, tmp_path):
    shutil.copytree(tiny_store["store"].root, tmp_path / "s")
    return Store(tmp_path / "s")


def test_a_new_system_is_one_class_and_one_registration(tiny_store, store):
    part_id = tiny_store["partition"].id
    with pytest.raises(FedL2PError, match="unknown pFL system 'toy-fedavg' \\(--algo\\); choose one of: pfedla"):
        execute(pfl, cfg_of("toy-fedavg"), store, {"partition": part_id})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker process computes (the CLI's --threads default)
    try:
        with plugins.using(plugins.build("tests.test_systems")):
            art = trained_and_evaluated(cfg_of("toy-fedavg"), store, part_id, tiny_store)
            one = art.file("model.safetensors").read_bytes()
            two, _ = execute(pfl, cfg_of("toy-fedavg"), store, {"partition": part_id}, force=True, runtime=Runtime(workers=2))
    finally:
        torch.set_num_threads(threads)
    assert two.id == art.id and two.file("model.safetensors").read_bytes() == one  # the same path: read before
    assert two.manifest["computed_on"]["workers"] == 2 and two.manifest["computed_on"]["engine"] == "local"


def test_a_module_system_of_api_1_still_trains_and_is_noted_once(tiny_store, store):
    catalog = plugins.build("tests.test_systems")
    notes = [n for n in catalog.notes if "toy-fedavg" in n]
    assert len(notes) == 1 and "is a module of functions (tests.toy_system_v1)" in notes[0], catalog.notes
    assert 'trainer="tests.toy_system_v1:ClassName"' in notes[0]
    with plugins.using(catalog):
        art = trained_and_evaluated(cfg_of("toy-fedavg-v1"), store, tiny_store["partition"].id, tiny_store,
                                    "Toy FedAvg v1", toy_system_v1.accuracy)
    assert art.metrics["algo"] == "toy-fedavg-v1"


def trained_and_evaluated(cfg, store, part_id, tiny_store, label="Toy FedAvg", accuracy=None):
    art, reused = execute(pfl, cfg, store, {"partition": part_id})
    assert not reused and execute(pfl, cfg, store, {"partition": part_id})[1] and art.file("model.safetensors").is_file()
    assert set(art.config) >= {"local_epochs", "lr"} and "hn_lr" not in art.config  # its own settings only
    pcfg = personalize.PersonalizeConfig(methods=["ft-bnc", cfg.algo], epochs=1, batch_size=16, base_lr=0.01, seeds=[0])
    pers, _ = execute(personalize, pcfg, store, {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id})
    _, r = personalize.load(store, pers.id)
    assert r.methods == ["ft-bnc", cfg.algo] and f"| {label} |" in pers.file("summary.md").read_text()
    t = pfl.load(store, art.id, plugins.current())
    _, p = partition.load(store, part_id)
    accuracy = accuracy or pfl.system(cfg.algo, plugins.current()).accuracy
    want = [accuracy(t, int(c), p.client(int(c)), 0, 1) for c in r.client]
    np.testing.assert_allclose(r.acc_after[1, 0], want)
    return art


def test_a_system_declares_its_own_options_and_they_enter_its_id(tiny_store, store):
    part_id = tiny_store["partition"].id
    with plugins.using(plugins.build("tests.test_systems")):
        plain, _ = execute(pfl, cfg_of("toy-scaled"), store, {"partition": part_id})
        same, reused = execute(pfl, replace(cfg_of("toy-scaled"), options={"lr_scale": "1.0"}), store, {"partition": part_id})
        half, _ = execute(pfl, replace(cfg_of("toy-scaled"), options={"lr_scale": "0.5"}), store, {"partition": part_id})
        assert plain.config["options"] == {"lr_scale": 1.0, "note": ""} and reused and same.id == plain.id
        assert half.id != plain.id and half.config["options"]["lr_scale"] == 0.5
        assert half.file("model.safetensors").read_bytes() != plain.file("model.safetensors").read_bytes()
        for options, line in [({"lr": "2"}, "has no option 'lr' \\(its options: lr_scale, note\\)"),
                              ({"lr_scale": "fast"}, "lr_scale must be a number, got 'fast'")]:
            with pytest.raises(FedL2PError, match="--options: .*" + line):
                execute(pfl, replace(cfg_of("toy-scaled"), options=options), store, {"partition": part_id})
    with pytest.raises(FedL2PError, match="--options: pFL system 'pfedla' takes no options, got 'x'"):
        execute(pfl, replace(cfg_of("pfedla"), options={"x": "1"}), store, {"partition": part_id})
    assert "options" not in pfl.identity(cfg_of("pfedla"), plugins.build())  # a system without options: its id as before


def test_options_on_the_command_line(tiny_store, store, capsys, monkeypatch):
    """`--options name=value,...`: a bad one is one line naming --options and exit 2; a good one trains."""
    from fedl2p_cli.cli.main import run_cli
    monkeypatch.setenv("FEDL2P_STORE", str(store.root))
    base = ["--plugin", "tests.test_systems", "pfl-train", "--algo", "toy-scaled", "--rounds", "1", "--fraction", "0.5",
            "--local-epochs", "1", "--batch-size", "16", "--partition", tiny_store["partition"].id]
    capsys.readouterr()
    with plugins.using(plugins.build()):  # --plugin loads into this catalog, not the test process's
        assert run_cli(base + ["--options", "lr_scale=fast"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].endswith("--options: lr_scale must be a number, got 'fast'") and "Traceback" not in "".join(err)
        assert run_cli(base + ["--options", "lr_scale=0.5,note=half"]) == 0
    art = store.newest("pfl", lambda a: a.config["algo"] == "toy-scaled")
    assert art.config["options"] == {"lr_scale": 0.5, "note": "half"}


def test_personalize_refuses_two_artifacts_of_one_system_and_names_a_missing_plugin(tiny_store, store):
    """Two --pfl ids of one system would make one row (the later silently replacing the earlier): refused in one
    line. A system named in --methods whose plugin is not loaded, while its artifact is stored: the line names the
    plugin to load, not `meta-train`."""
    part_id = tiny_store["partition"].id
    pcfg = personalize.PersonalizeConfig(methods=["ft-bnc"], epochs=1, batch_size=16, base_lr=0.01, seeds=[0])
    ids = {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id}
    with plugins.using(plugins.build("tests.test_systems")):
        a, _ = execute(pfl, cfg_of("toy-fedavg"), store, {"partition": part_id})
        b, _ = execute(pfl, replace(cfg_of("toy-fedavg"), rounds=1), store, {"partition": part_id})
        with pytest.raises(FedL2PError, match=f"--pfl: {a.id} and {b.id} are both 'toy-fedavg'; a personalisation"):
            execute(personalize, pcfg, store, ids | {"pfl": [a.id, b.id]})
    with plugins.using(plugins.build()), pytest.raises(FedL2PError, match="tests.test_systems") as e:  # built-ins only:
        execute(personalize, replace(pcfg, methods=["ft-bnc", "toy-fedavg"]), store, ids)  # another test may have loaded it
    assert "meta-train" not in str(e.value), e.value


def test_an_api_1_system_reports_its_rounds_to_the_tracker(tiny_store, store, tmp_path):
    """A module system of API 1 runs its own rounds with the progress its `train` receives: that progress carries the
    tracker the build opened (--track), so its rounds reach TensorBoard as a built-in system's do."""
    pytest.importorskip("tensorboard", reason="the [tensorboard] extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fedl2p_cli.stages.interface import Inputs, StageContext, run_stage
    runtime = Runtime(track="tensorboard", track_uri=str(tmp_path / "runs"), catalog=plugins.build("tests.test_systems"))
    inputs = Inputs.given({"partition": tiny_store["partition"].id})
    art, _ = run_stage(pfl, cfg_of("toy-fedavg-v1"), inputs, StageContext(store, runtime))
    acc = EventAccumulator(str(tmp_path / "runs" / "pfl" / art.id))
    acc.Reload()
    assert [e.step for e in acc.Scalars("round_s")] == [1, 2]
