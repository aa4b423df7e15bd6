"""fedl2p without a clone: the wheel carries the pipelines and the Flower app, Fashion-MNIST is installed or
asked for when missing, and `fedl2p flower app` writes the app `flwr run` takes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fedl2p_cli import __version__
from fedl2p_cli.cli.main import run_cli
from fedl2p_cli.data import datasets, provision

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "MANIFEST.in")


def _idx(path: Path, array: np.ndarray) -> None:
    head = bytes([0, 0, 8, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(head + array.astype(np.uint8).tobytes())


def _fake_apt(folder: Path, calls: list):
    """apt-get as a function: `install dataset-fashion-mnist` writes four small IDX files into `folder`."""
    def run(cmd, **_):
        calls.append(cmd)
        if "install" in cmd:
            folder.mkdir(parents=True, exist_ok=True)
            for split, n in (("train", 5), ("t10k", 3)):
                _idx(folder / f"{split}-images-idx3-ubyte", np.full((n, 28, 28), 7))
                _idx(folder / f"{split}-labels-idx1-ubyte", np.arange(n) % 10)
        return subprocess.CompletedProcess(cmd, 0)
    return run


def test_missing_fmnist_is_installed_with_apt_where_permitted(tmp_path, monkeypatch):
    folder = tmp_path / "fashion-mnist"
    calls: list = []
    monkeypatch.setattr(datasets, "DEBIAN_FMNIST", folder)
    monkeypatch.delenv("FEDL2P_DATA", raising=False)
    monkeypatch.setattr(provision, "apt_command", lambda: ["apt-get"])
    monkeypatch.setattr(provision.subprocess, "run", _fake_apt(folder, calls))
    ds = datasets.load_fmnist()
    assert calls == [["apt-get", "install", "-y", "-q", "dataset-fashion-mnist"]]
    assert tuple(ds.images.shape) == (8, 1, 32, 32) and ds.labels.tolist() == [0, 1, 2, 3, 4, 0, 1, 2]


def test_missing_fmnist_without_apt_is_one_line_naming_the_variable(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(datasets, "DEBIAN_FMNIST", tmp_path / "fashion-mnist")
    monkeypatch.delenv("FEDL2P_DATA", raising=False)
    monkeypatch.setenv(provision.NO_APT, "1")
    monkeypatch.setattr(provision.subprocess, "run", lambda *a, **k: pytest.fail("apt-get ran although refused"))
    assert provision.apt_command() is None
    assert run_cli(["partition", "--dataset", "fmnist", "--store", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "FEDL2P_DATA" in err and "dataset-fashion-mnist" in err, err
    assert not (tmp_path / "store").exists()


def test_flower_app_is_written_out_or_found(tmp_path, capsys):
    assert run_cli(["flower", "app"]) == 0
    installed = Path(capsys.readouterr().out.strip())
    text = (installed / "pyproject.toml").read_text()
    assert 'serverapp = "fedl2p_cli.flower.app:server_app"' in text and 'license = "Apache-2.0"' in text
    assert run_cli(["flower", "app", str(tmp_path / "app")]) == 0
    assert (tmp_path / "app" / "pyproject.toml").read_text() == text
    assert run_cli(["flower", "app", str(tmp_path / "app")]) == 0  # again: the same file, nothing to refuse
    older = text.replace("fedl2p_cli.flower.app:", "fedl2p_cli.stages.flower_app:")  # an earlier version's app
    (tmp_path / "app" / "pyproject.toml").write_text(older)
    assert run_cli(["flower", "app", str(tmp_path / "app")]) == 0  # rewritten with this version's components
    assert (tmp_path / "app" / "pyproject.toml").read_text() == text
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    assert run_cli(["flower", "app", str(tmp_path / "other")]) == 2
    assert (tmp_path / "other" / "pyproject.toml").read_text() == "[project]\nname = 'mine'\n"


def test_version(capsys):
    assert run_cli(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"fedl2p {__version__}"


def test_the_wheel_works_without_the_source_tree(tmp_path):
    """Build the wheel, install it alone into a fresh venv whose other packages (torch, ...) come from this one's
    site-packages by a .pth line, and run it from an empty folder: --version, run --list, and the tiny pipeline."""
    src = tmp_path / "src"
    for folder in ("fedl2p_cli", "pipelines"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for f in SOURCES:
        shutil.copy(ROOT / f, src / f)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                   check=True, capture_output=True)
    wheel, = (tmp_path / "dist").glob("fedl2p-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"fedl2p_cli/pipelines/quickstart.toml", "fedl2p_cli/pipelines/tiny.toml", "fedl2p_cli/pipelines/_cifar10.toml",
            "fedl2p_cli/pipelines/bench/fs-0.1.toml", "fedl2p_cli/flower/project/pyproject.toml"} <= set(names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site, = venv.glob("lib/python*/site-packages")
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # torch & co. only: no .pth runs from there
    subprocess.run([*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FEDL2P_STORE")}

    def fedl2p(*args: str) -> str:
        r = subprocess.run([str(venv / "bin" / "fedl2p"), *args], cwd=empty, env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        return r.stdout

    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import fedl2p_cli; print(fedl2p_cli.__file__)"],
                           cwd=empty, env=env, capture_output=True, text=True, check=True).stdout
    assert Path(where).is_relative_to(site), where  # the installed copy, not this checkout
    assert fedl2p("--version").strip() == f"fedl2p {__version__}"
    assert {"quickstart", "tiny", "bench/fs-1000"} <= {line.split()[0] for line in fedl2p("run", "--list").splitlines()}
    out = fedl2p("run", "tiny")
    assert "personalize" in out and len(list((empty / "artifacts" / "personalize").iterdir())) == 2
    assert Path(fedl2p("flower", "app").strip()).is_relative_to(site)
