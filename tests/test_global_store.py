"""`--store` before the command or after it (issue 80): `fedl2p --store X run ...` was refused with a hint at
--threads. The command's own --store wins over the one before it, and either over FEDL2P_STORE."""

from __future__ import annotations

from fedl2p_cli.artifacts import Store
from fedl2p_cli.cli.main import run_cli

PARTITION = ["partition", "--dataset", "digits", "--clients", "4", "--samples-per-client", "20"]


def listed(capsys, *args: str) -> str:
    """What `fedl2p ARGS` prints (ARGS: an `artifacts list` with its stores)."""
    capsys.readouterr()
    assert run_cli(list(args)) == 0
    return capsys.readouterr().out


def test_the_store_is_taken_before_the_command_or_after_it(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDL2P_STORE", str(tmp_path / "env"))
    capsys.readouterr()
    assert run_cli(["--store", str(tmp_path / "before"), *PARTITION]) == 0, capsys.readouterr().err
    (pid,) = Store(tmp_path / "before").ids("partition")
    assert not (tmp_path / "env").exists() and not (tmp_path / "artifacts").exists()
    assert pid in listed(capsys, "artifacts", "list", "--store", str(tmp_path / "before"))
    assert pid in listed(capsys, "--store", str(tmp_path / "before"), "artifacts", "list")
    assert pid not in listed(capsys, "--store", str(tmp_path / "before"), "artifacts", "list", "--store",
                             str(tmp_path / "env"))  # the command's own wins
    assert pid not in listed(capsys, "artifacts", "list")  # FEDL2P_STORE where neither is given
