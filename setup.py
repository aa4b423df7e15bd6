"""The one thing pyproject.toml cannot say: the repository's top-level pipelines/ folder is installed as the package
data folder fedl2p_cli/pipelines, so `fedl2p run NAME` finds the shipped pipelines in a wheel as in a clone."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["fedl2p_cli*"]), "fedl2p_cli.pipelines", "fedl2p_cli.pipelines.bench"],
      package_dir={"fedl2p_cli.pipelines": "pipelines"},
      package_data={"fedl2p_cli.pipelines": ["*.toml"], "fedl2p_cli.pipelines.bench": ["*.toml"]})
