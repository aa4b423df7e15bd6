"""Fashion-MNIST when it is missing: Debian's dataset-fashion-mnist package, installed with apt-get where that is
available and permitted, otherwise one line saying where to put the files. `python -m fedl2p_cli.data.provision`
is `make data`'s Fashion-MNIST step."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

PACKAGE = "dataset-fashion-mnist"
NO_APT = "FEDL2P_NO_APT"  # set (to anything) to never run apt-get
FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")  # where Debian's dataset-fashion-mnist installs it
ENV_DATA = "FEDL2P_DATA"


def complete(folder: Path) -> bool:
    return all((folder / n).exists() or (folder / f"{n}.gz").exists() for n in FILES)


def missing_line(folder: Path) -> str:
    return (f"Fashion-MNIST not found in {folder}: install the Debian package {PACKAGE}, or put the four IDX files "
            "(train/t10k images/labels, .gz or not) in a folder and set FEDL2P_DATA to it (or pass --data-dir)")


def apt_command() -> list[str] | None:
    """How to run apt-get here, or None: not Debian-like, opted out, or no right to install (neither root nor a
    sudo that needs no password)."""
    if os.environ.get(NO_APT) or shutil.which("apt-get") is None:
        return None
    if os.geteuid() == 0:
        return ["apt-get"]
    if shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        return ["sudo", "-n", "apt-get"]
    return None


def install_fmnist(folder: Path) -> bool:
    """Install the package when apt-get may be used; True if the files are then in `folder`."""
    apt = apt_command()
    if apt is None:
        return False
    print(f"Fashion-MNIST is missing: installing the Debian package {PACKAGE} (apt-get; {NO_APT}=1 turns this off)...",
          file=sys.stderr, flush=True)
    install = [*apt, "install", "-y", "-q", PACKAGE]
    quiet: dict[str, Any] = {"capture_output": True, "env": dict(os.environ, DEBIAN_FRONTEND="noninteractive")}
    if subprocess.run(install, **quiet).returncode != 0:  # a stale package list: refresh it once
        subprocess.run([*apt, "update", "-q"], **quiet)
        subprocess.run(install, **quiet)
    return complete(folder)


def main() -> int:
    if os.environ.get(ENV_DATA) or complete(DEBIAN_FMNIST) or install_fmnist(DEBIAN_FMNIST):
        return 0
    print(missing_line(DEBIAN_FMNIST), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
