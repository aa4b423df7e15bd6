"""The plugin contract as a user meets it: the shortest plugin (examples/model-plugin) installed and used by a fresh
`fedl2p` process; a plugin written for another API version refused in one line; a plugin written against fedl2p's
internals (as the FedBN example was before `fedl2p_cli.api`) still loaded, with one warning, once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from torch import nn

ROOT = Path(__file__).resolve().parents[1]

# the FedBN example's registration as it was written before fedl2p_cli.api: internal modules of three layers
OLD = '''
from fedl2p_cli.data.sources import Source
from fedl2p_cli.methods import HandMade
from fedl2p_cli.stages.harness import batches


def register(registry):
    registry.add_method(HandMade("old-half", "Old half", beta=0.5, baseline=False))
'''
NEWER = "FEDL2P_API = 2\n\ndef register(registry):\n    pass\n"


def fedl2p(args: list, path: list[Path], cwd: Path):
    env = os.environ | {"PYTHONPATH": os.pathsep.join(map(str, [*path, ROOT])), "FEDL2P_DEVICE": "cpu"}
    env.pop("FEDL2P_PLUGINS", None)
    return subprocess.run([sys.executable, "-m", "fedl2p_cli", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=600)


def test_the_shortest_plugin_installed_adds_a_model_that_trains(tmp_path):
    site, src = tmp_path / "site", tmp_path / "src"
    shutil.copytree(ROOT / "examples" / "model-plugin", src, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--target", str(site), str(src)], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr
    r = fedl2p(["pretrain", "--help"], [site], tmp_path)
    assert r.returncode == 0 and "From plugins: wide-cnn" in r.stdout and "(fedl2p_wide_cnn)" in r.stdout, r.stdout
    assert not r.stderr, r.stderr  # it imports nothing of fedl2p but the api: no warning
    store = tmp_path / "store"
    r = fedl2p(["partition", "--store", store, "--dataset", "digits-c", "--clients", "6", "--samples-per-client", "30",
                "--corruptions", "clean,invert"], [site], tmp_path)
    assert r.returncode == 0, r.stderr
    r = fedl2p(["pretrain", "--store", store, "--model", "wide-cnn", "--rounds", "1", "--fraction", "1"], [site], tmp_path)
    assert r.returncode == 0, r.stderr
    manifest = json.loads(next((store / "pretrain").glob("*/manifest.json")).read_text())
    assert manifest["config"]["model"] == "wide-cnn"
    assert manifest["plugins"] == [{"module": "fedl2p_wide_cnn", "dist": "fedl2p-wide-cnn", "version": "0.1.0"}]


def test_a_plugin_for_another_api_version_is_one_line(tmp_path):
    (tmp_path / "newer_plugin.py").write_text(NEWER)
    r = fedl2p(["--plugin", "newer_plugin", "partition", "--help"], [tmp_path], tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "plugin 'newer_plugin' is written for fedl2p API 2; this fedl2p has API 1" in lines[0]


def test_a_plugin_on_the_old_internals_works_and_warns_once(tmp_path):
    """Nothing it imports moved, so it loads and its method is there; one warning names the internal modules it
    imports, however many times it is named (here: --plugin and a pipeline's `plugins`)."""
    (tmp_path / "old_plugin").mkdir()
    (tmp_path / "old_plugin" / "__init__.py").write_text(textwrap.dedent(OLD))
    r = fedl2p(["--plugin", "old_plugin", "personalize", "--help"], [tmp_path], tmp_path)
    assert r.returncode == 0 and "old-half" in r.stdout, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "plugin 'old_plugin' imports fedl2p's internals (fedl2p_cli.data.sources, " \
        "fedl2p_cli.methods, fedl2p_cli.stages.harness)" in warnings[0] and "fedl2p_cli.api" in warnings[0], r.stderr
    pipe = tmp_path / "p.toml"
    pipe.write_text('plugins = ["old_plugin"]\n[partition]\ndataset = "digits-c"\nclients = 6\nsamples_per_client = 30\n'
                    'corruptions = ["clean", "invert"]\n[pretrain]\nrounds = 1\nfraction = 1.0\n')
    r = fedl2p(["--plugin", "old_plugin", "run", pipe, "--store", tmp_path / "store"], [tmp_path], tmp_path)
    assert r.returncode == 0, r.stderr
    assert sum(line.startswith("warning:") for line in r.stderr.splitlines()) == 1, r.stderr



class _TwoLinears(nn.Module):
    """A classifier `out` followed in module order by another Linear: the last Linear is not the head."""

    def __init__(self, in_channels: int, num_classes: int):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(in_channels, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                  nn.Flatten())
        self.out = nn.Linear(4, num_classes)
        self.aux = nn.Linear(num_classes, 2)

    def forward(self, x):
        return self.out(self.body(x))


def test_api_head_prefix_is_the_declared_head_or_the_last_linear():
    """A plugin system splitting body and head (FedPer) gets the same head FedBABU and --reset-head use."""
    from fedl2p_cli import api, plugins

    def models(reg):
        reg.add_model("declared", _TwoLinears, head="out")
        reg.add_model("undeclared", _TwoLinears)

    with plugins.using(plugins.build(models)):
        assert api.head_prefix(api.build_model("declared", 1, 10)) == "out."
        assert api.head_prefix(api.build_model("undeclared", 1, 10)) == "aux."
