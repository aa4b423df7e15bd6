"""Bad input through the real console entry point: one line, non-zero exit, no traceback, nothing written."""

import os
import subprocess
import sys

import torch


def fedl2p(*args, store):
    env = dict(os.environ, FEDL2P_STORE=str(store), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "fedl2p_cli", *args], capture_output=True, text=True, env=env, timeout=300)


def snapshot(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def cases(tmp):
    bad_init = tmp / "bad.pt"
    torch.save({"weight": torch.zeros(3)}, bad_init)
    return [
        (["partition", "--alpha", "0"], "--alpha must be > 0"),
        (["partition", "--dataset", "digits", "--clients", "1000", "--samples-per-client", "100"], "lower --clients"),
        (["partition", "--dataset", "nope"], "unknown dataset"),
        (["partition", "--dataset", "digits-c", "--corruptions", "clean,fog"], "unknown corruption"),
        (["partition", "--dataset", "cifar10", "--data-dir", str(tmp / "missing")], "CIFAR-10 not found"),
        (["partition", "--dataset", "image-folder", "--data-dir", str(tmp / "missing")], "image-folder needs"),
        (["partition", "--dataset", "fmnist", "--data-dir", str(tmp / "missing")], "does not exist"),
        (["partition", "--dataset", "digits", "--exclude", "zzzz"], "no partition artifact with id"),
        (["meta-train", "--client-bn", "stale"], "unknown --client-bn"),
        (["meta-train", "--meta-opt", "adamw"], "unknown --meta-opt"),
        (["meta-train", "--psi-power", "-1"], "--psi-power non-negative"),
        (["personalize", "--client-bn", "stale"], "unknown --client-bn"),
        (["pretrain", "--from", "zzzz"], "no partition artifact with id"),
        (["pretrain", "--algo", "sgd"], "unknown algorithm"),
        (["pretrain", "--model", "vgg"], "unknown model"),
        (["pretrain", "--rounds", "0"], "--rounds must be positive"),
        (["pretrain", "--init", str(bad_init)], "do not fit model"),
        (["meta-train", "--nets", "all"], "unknown --nets"),
        (["meta-train", "--stats", "zzzz"], "no stats artifact"),
        (["personalize", "--methods", "ft-bnc,magic"], "unknown method"),
        (["personalize", "--seeds", "a,b"], "expected comma-separated integers"),
        (["run", str(tmp / "nope.toml")], "pipeline file not found"),
        (["artifacts", "show", "nostage"], "unknown stage"),
    ]


def test_bad_input_gives_one_line(tiny_store, tmp_path):
    root = tiny_store["store"].root
    before = snapshot(root)
    for args, expect in cases(tmp_path):
        r = fedl2p(*args, store=root)
        err = r.stderr.strip()
        assert r.returncode == 2, args
        assert "Traceback" not in r.stderr + r.stdout, (args, r.stderr)
        assert len(err.splitlines()) == 1 and expect in err, (args, err)
    assert snapshot(root) == before


def test_help_explains_every_option():
    for cmd in ("partition", "pretrain", "stats", "meta-train", "personalize", "run"):
        r = subprocess.run([sys.executable, "-m", "fedl2p_cli", cmd, "--help"], capture_output=True, text=True,
                           env=dict(os.environ, COLUMNS="250"))
        assert r.returncode == 0
        opts = [ln for ln in r.stdout.splitlines() if ln.strip().startswith("│ --") or ln.strip().startswith("│ *")]
        for ln in opts:  # every option line has help text after its type
            assert len(ln.split()) > 3, (cmd, ln)


def test_artifacts_list_and_verify(tiny_store):
    r = fedl2p("artifacts", "verify", store=tiny_store["store"].root)
    assert r.returncode == 0 and "FAIL" not in r.stdout
    r = fedl2p("artifacts", "list", store=tiny_store["store"].root)
    assert r.returncode == 0 and tiny_store["meta"].id in r.stdout
