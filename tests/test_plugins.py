"""Plugins (fedl2p_cli/plugins.py): found by entry point, --plugin, FEDL2P_PLUGINS and a pipeline's `plugins`; a
plugin's pieces used like built-ins; an artifact made with one names it, and loading it without the plugin is one line;
a broken plugin, a name clash and a model without BatchNorm are one line each, exit 2, nothing written. Every CLI run is
a subprocess: a plugin's registration is per process, and the suite's own processes keep the built-ins only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedl2p_cli.artifacts import Store
from fedl2p_cli.stages import partition

from .helpers import execute

PLUGIN = '''
from torch import nn
from fedl2p_cli.api import HandMade


def net(in_channels, num_classes):
    return nn.Sequential(nn.Conv2d(in_channels, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, num_classes))


def register(registry):
    registry.add_model("tp-net", net, "the test plugin's net")
    registry.add_method(HandMade("tp-half", "TP half", beta=0.5, baseline=False))
'''
CLASH = "def register(registry):\n    registry.add_model('small-cnn', lambda: None)\n"
BROKEN = "import not_a_module_anywhere\n"
NO_BN = '''
from torch import nn


def register(registry):
    registry.add_model("flat", lambda in_channels, num_classes: nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes)))
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> dict:
    """A folder of plugin modules; an installed distribution (dist-info with an entry point) in another; a store
    holding a tiny partition."""
    root = tmp_path_factory.mktemp("plugins")
    mods = root / "mods"
    for name, text in (("tp_plugin", PLUGIN), ("tp_clash", CLASH), ("tp_broken", BROKEN), ("tp_nobn", NO_BN)):
        (mods / name).mkdir(parents=True)
        (mods / name / "__init__.py").write_text(textwrap.dedent(text))
    installed = root / "installed"
    (installed / "tp_installed").mkdir(parents=True)
    (installed / "tp_installed" / "__init__.py").write_text(textwrap.dedent(PLUGIN))
    info = installed / "fedl2p_tp_installed-0.3.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fedl2p-tp-installed\nVersion: 0.3.1\n")
    (info / "entry_points.txt").write_text("[fedl2p.plugins]\ntp = tp_installed\n")
    (info / "top_level.txt").write_text("tp_installed\n")
    store = Store(root / "store")
    part, _ = execute(partition, partition.PartitionConfig(dataset="digits-c", clients=6, samples_per_client=30,
                                                      corruptions=["clean", "invert"], seed=0), store, plot=False)
    return {"mods": mods, "installed": installed, "store": store, "partition": part.id, "root": root}


def cli(args: list, path: Path | None = None, env: dict | None = None, store: Store | None = None):
    full = dict(os.environ, FEDL2P_DEVICE="cpu", PYTHONPATH=os.pathsep.join(filter(None, [str(path or ""), os.getcwd()])))
    full.pop(ENV_PLUGINS, None)
    if store is not None:
        full["FEDL2P_STORE"] = str(store.root)
    return subprocess.run([sys.executable, "-m", "fedl2p_cli", *map(str, args)], capture_output=True, text=True,
                          env=full | (env or {}), timeout=300)


ENV_PLUGINS = "FEDL2P_PLUGINS"


def one_line_exit_2(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    return lines[0]


def test_an_installed_plugin_is_found_by_its_entry_point_and_its_artifacts_name_it(site):
    store, mods = site["store"], site["installed"]
    r = cli(["pretrain", "--help"], mods)
    assert r.returncode == 0 and "From plugins: tp-net" in r.stdout and "(tp_installed)" in r.stdout, r.stdout
    r = cli(["pretrain", "--model", "tp-net", "--rounds", "1", "--fraction", "1"], mods, store=store)
    assert r.returncode == 0, r.stderr
    art = store.load("pretrain", verify=False)
    assert art.manifest["plugins"] == [{"module": "tp_installed", "dist": "fedl2p-tp-installed", "version": "0.3.1"}]
    assert "plugins" not in art.config  # the manifest's record is not part of the id
    # the artifact's children carry the record; without the plugin, loading it is one line naming what to install
    r = cli(["stats"], mods, store=store)
    assert r.returncode == 0, r.stderr
    assert store.load("stats", verify=False).manifest["plugins"] == art.manifest["plugins"]
    line = one_line_exit_2(cli(["stats", "--force"], None, store=store))
    assert "made with plugin 'tp_installed'" in line and "pip install fedl2p-tp-installed==0.3.1" in line


@pytest.mark.parametrize("how", ["--plugin", "env", "pipeline"])
def test_a_plugin_named_by_option_environment_or_pipeline(site, tmp_path, how):
    store = Store(tmp_path / "s")
    args: list = ["pretrain", "--model", "tp-net"]
    env = {}
    if how == "--plugin":
        args = ["--plugin", "tp_plugin", *args]
    elif how == "env":
        env = {ENV_PLUGINS: "tp_plugin"}
    if how == "pipeline":
        pipe = tmp_path / "p.toml"
        pipe.write_text('plugins = ["tp_plugin"]\n[partition]\ndataset = "digits-c"\nclients = 6\nsamples_per_client = 30\n'
                        'corruptions = ["clean", "invert"]\n[pretrain]\nmodel = "tp-net"\nrounds = 1\nfraction = 1.0\n')
        r = cli(["run", pipe, "--store", store.root], site["mods"])
        assert r.returncode == 0, r.stderr
        assert store.load("pretrain", verify=False).config["model"] == "tp-net"
        assert store.load("pretrain", verify=False).manifest["plugins"] == [{"module": "tp_plugin", "dist": None, "version": None}]
        return
    # the model is known, so the stage goes on to ask for its partition (and refuses: none in this store)
    r = cli(args, site["mods"], env, store)
    assert r.returncode == 2 and "no partition artifact" in r.stderr, r.stderr
    r = cli(["pretrain", "--model", "tp-net"], site["mods"], store=store)  # without it: an unknown model
    assert "unknown model 'tp-net'" in one_line_exit_2(r)


@pytest.mark.parametrize("module, says", [("tp_clash", "registers model 'small-cnn', which fedl2p (built-in) already"),
                                          ("tp_broken", "plugin 'tp_broken' (--plugin) failed to import: ModuleNotFoundError")])
def test_a_clashing_or_broken_plugin_is_one_line(site, tmp_path, module, says):
    store = Store(tmp_path / "s")
    r = cli(["--plugin", module, "partition", "--dataset", "digits-c", "--clients", "6"], site["mods"], store=store)
    assert says in one_line_exit_2(r)
    assert not store.root.exists()  # nothing written


def test_a_model_without_batchnorm_is_refused_and_nothing_written(site):
    store = site["store"]
    before = store.ids("pretrain")
    r = cli(["--plugin", "tp_nobn", "pretrain", "--model", "flat", "--from", site["partition"]], site["mods"],
            store=store)
    assert "model 'flat' has no BatchNorm1d/2d layer" in one_line_exit_2(r)
    assert store.ids("pretrain") == before and not list((store.root / "pretrain").glob(".tmp-*"))


def test_the_manifest_of_a_builtin_artifact_names_no_plugin(site):
    art = site["store"].load("partition", site["partition"])
    assert "plugins" not in art.manifest and json.loads((art.path / "manifest.json").read_text())["id"] == art.id


def test_a_broken_installed_plugin_warns_where_none_of_its_pieces_is_needed(site, tmp_path):
    """An installed plugin with a mistyped entry point stopped every command (`artifacts list` and `run tiny`
    included); now one warning line, and the command runs (issue 51)."""
    broken = tmp_path / "broken"
    info = broken / "fedl2p_tp_typo-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fedl2p-tp-typo\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[fedl2p.plugins]\ntypo = tp_tpyo_mistyped\n")
    r = cli(["artifacts", "list"], broken, store=site["store"])
    lines = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("note: ")]  # notes: plugins not here
    assert r.returncode == 0 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("warning: plugin 'tp_tpyo_mistyped' (entry point 'typo' of fedl2p-tp-typo) failed to "
                               "import: ModuleNotFoundError") and site["partition"] in r.stdout


def test_a_report_opens_without_the_plugins_its_artifacts_were_made_with(site, tmp_path):
    store = Store(tmp_path / "s")
    shutil.copytree(site["store"].root, store.root)
    r = cli(["pretrain", "--model", "tp-net", "--rounds", "1", "--fraction", "1"], site["installed"], store=store)
    assert r.returncode == 0, r.stderr
    pre = store.load("pretrain", verify=False).id
    r = cli(["report", pre], None, store=store)  # the plugin uninstalled: the page reads files only
    assert r.returncode == 0 and "wrote report artifact" in r.stdout, r.stderr
    r = cli(["report", pre], None, store=store)
    assert r.returncode == 0 and "reused report artifact" in r.stdout, r.stderr
    for cmd in (["artifacts", "show", "pretrain", pre], ["artifacts", "list", "pretrain"]):  # they say what is missing
        r = cli(cmd, None, store=store)
        assert r.returncode == 0 and f"pretrain/{pre} was made with plugin " in r.stderr, r.stderr
        assert "not installed here" in r.stderr


def test_a_worker_process_takes_its_parents_allow_list_from_the_runtime_and_warns_nothing_again():
    """--allow-import reaches worker processes in the Runtime they receive (not through the environment), and a
    worker's catalog does not repeat the parent's warning about a broken plugin."""
    from fedl2p_cli import plugins
    from fedl2p_cli.catalog import Catalog
    from fedl2p_cli.runtime import Runtime
    sent = Runtime(allow_import=("tp_allowed",)).to_dict()
    with plugins.using(Catalog()):
        catalog = plugins.as_worker(Runtime.from_dict(sent).allow_import)
        assert catalog is plugins.current() and "tp_allowed" in catalog.allowed and catalog.quiet
        from fedl2p_cli.models import guard
        assert guard.allowed("tp_allowed.sub", catalog) and not guard.allowed("tp_other", catalog)
