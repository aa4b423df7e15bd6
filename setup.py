"""The one thing pyproject.toml cannot say: the repository's top-level pipelines/ folder is installed as the package
data folder fedl2p_cli/pipelines, so `fedl2p run NAME` finds the shipped pipelines in a wheel as in a clone. The
Flower app's folder (`fedl2p flower app`: a pyproject.toml, no Python) is a data package of its own, named here so
that setuptools installs it without a warning."""

from setuptools import find_packages, setup

DATA = ["fedl2p_cli.pipelines", "fedl2p_cli.pipelines.bench", "fedl2p_cli.flower.project"]

setup(packages=[*find_packages(include=["fedl2p_cli*"]), *DATA],
      package_dir={"fedl2p_cli.pipelines": "pipelines"},
      package_data={"fedl2p_cli.pipelines": ["*.toml"], "fedl2p_cli.pipelines.bench": ["*.toml"],
                    "fedl2p_cli.flower.project": ["pyproject.toml"]})
