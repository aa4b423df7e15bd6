"""The example plugin package (examples/fedl2p-fedbn) installed as a user would, found through its `fedl2p.plugins`
entry point by a fresh `fedl2p` process, and run end to end at tiny scale: its .npz dataset partitioned, its
MobileNetV3-small pretrained, statistics, FedL2P meta-trained, `pfl-train --algo fedbn`, and `personalize` with its
hand-made method, FedBN and FedL2P side by side. Its FedBN then trains again with `--workers 2` (the same bytes) and,
where the Flower extra is installed, under `--engine flower` (the same id, weights equal to float32 rounding)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from .test_flower import HAS_FLOWER

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "examples" / "fedl2p-fedbn"

PIPELINE = """
name = "fedbn-tiny"
[partition]
dataset = "npz"
data_dir = "{npz}"
clients = 8
samples_per_client = 24
alpha = 1000.0
unseen_fraction = 0.25
seed = 0
[pretrain]
model = "mobilenet-v3-small"
rounds = 1
fraction = 0.5
local_epochs = 1
batch_size = 8
eval_every = 1
[stats]
[[meta-train]]
preset = "fomaml"
rounds = 1
fraction = 0.25
iterations = 1
epochs = 1
batch_size = 8
[[pfl]]
algo = "fedbn"
model = "mobilenet-v3-small"
rounds = 2
fraction = 0.5
local_epochs = 1
batch_size = 8
eval_every = 1
[personalize]
pools = ["seen", "unseen"]
methods = ["ft-bnc", "ft-bn-only"]
epochs = 1
batch_size = 8
seeds = [0]
"""


PFL_ARGS = ["--algo", "fedbn", "--model", "mobilenet-v3-small", "--rounds", "2", "--fraction", "0.5", "--local-epochs",
            "1", "--batch-size", "8", "--eval-every", "1"]  # the pipeline's [[pfl]] table


def tiny_npz(path: Path) -> None:
    """4 classes (a bright quadrant each) in 2 domains (the second inverted), 16x16 grey images."""
    rng = np.random.default_rng(0)
    n = 240
    y = np.arange(n) % 4
    x = rng.integers(0, 60, (n, 16, 16))
    for k in range(4):
        r, c = divmod(k, 2)
        x[y == k, 8 * r:8 * r + 8, 8 * c:8 * c + 8] += 150
    domain = np.where(np.arange(n) % 8 < 4, "plain", "inverted")
    x[domain == "inverted"] = 255 - x[domain == "inverted"]
    np.savez(path, x=x.astype(np.uint8), y=y, domain=domain)


def test_the_example_package_end_to_end_through_its_entry_point(tmp_path):
    site, src = tmp_path / "site", tmp_path / "src"
    # a copy: an in-tree build leaves an egg-info beside the package, whose entry point other tests would then find
    shutil.copytree(PACKAGE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--target", str(site), str(src)], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr
    tiny_npz(tmp_path / "tiny.npz")
    (tmp_path / "tiny.toml").write_text(PIPELINE.format(npz=tmp_path / "tiny.npz"))
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "FEDL2P_DEVICE": "cpu"}
    env.pop("FEDL2P_PLUGINS", None)  # found by its entry point, nothing else
    run = subprocess.run([sys.executable, "-m", "fedl2p_cli", "run", str(tmp_path / "tiny.toml"), "--store",
                          str(tmp_path / "store")], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    store = tmp_path / "store"
    for pool in ("seen", "unseen"):
        pers = next(p for p in (store / "personalize").iterdir()
                    if json.loads((p / "summary.json").read_text())["pool"] == pool)
        summary = (pers / "summary.md").read_text()
        for row in ("| FT (BN C) |", "| FT BN-only (BN C) |", "| FedBN |", "| fedl2p-fomaml-binit0.9 |"):
            assert row in summary, (pool, row, summary)
        rows = json.loads((pers / "summary.json").read_text())["methods"]
        assert all(np.isfinite(rows[m]["mean"]) for m in ("ft-bnc", "ft-bn-only", "fedbn", "fedl2p-fomaml-binit0.9")), rows
    pfl = next((store / "pfl").iterdir())
    manifest = json.loads((pfl / "manifest.json").read_text())
    assert "fedl2p-fedbn" in json.dumps(manifest), manifest  # the plugin that made it, by distribution
    assert {f.name for f in pfl.iterdir()} >= {"fedbn.safetensors", "history.csv"}
    in_process = load_file(pfl / "fedbn.safetensors")
    part = json.loads((pfl / "manifest.json").read_text())["parents"]["partition"]
    for engine in ("local",) + (("flower",) if HAS_FLOWER else ()):
        again = subprocess.run([sys.executable, "-m", "fedl2p_cli", "pfl-train", *PFL_ARGS, "--partition", part,
                                "--workers", "2", "--engine", engine, "--force", "--store", str(store)],
                               capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
        assert again.returncode == 0 and pfl.name in again.stdout, again.stdout[-3000:] + again.stderr[-3000:]
        got = load_file(pfl / "fedbn.safetensors")
        assert got.keys() == in_process.keys()
        for k, v in in_process.items():  # worker processes: bit for bit; Ray's: float32 rounding
            torch.testing.assert_close(got[k], v, rtol=0, atol=0 if engine == "local" else 1e-5)
