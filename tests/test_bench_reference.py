"""`make bench-reference`: what it says when the authors' code or its packages are missing, and its server average.

The run itself needs a clone of royson/fedl2p and .venv-ref (learn2learn 0.1.7, flwr 0.17): not here."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "reference.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_a_ref_that_is_not_the_authors_repository_is_one_line_and_exit_2(tmp_path):
    p = run("--ref", str(tmp_path))
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "--ref" in lines[0] and "royson/fedl2p" in lines[0]


def test_a_missing_package_of_the_authors_code_is_named_in_one_line(tmp_path):
    client = tmp_path / "src" / "apps" / "clients" / "fedl2p_classification_client.py"
    client.parent.mkdir(parents=True)
    for d in (tmp_path / "src", tmp_path / "src" / "apps", client.parent):
        (d / "__init__.py").write_text("")
    client.write_text("import learn2learn_not_installed_here\n")
    p = run("--ref", str(tmp_path))
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "'learn2learn_not_installed_here'" in lines[0] and "bench-reference" in lines[0]


def test_the_server_averages_meta_parameters_weighted_by_validation_size():
    spec = importlib.util.spec_from_file_location("bench_reference", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    a = [np.array([1.0, 2.0]), np.array([10.0])]
    b = [np.array([4.0, 8.0]), np.array([40.0])]
    mean = mod.params_mean([(a, 1, {}), (b, 2, {})])  # their FedAvg: weights 1/3 and 2/3
    assert np.allclose(mean[0], [3.0, 6.0]) and np.allclose(mean[1], [30.0])
