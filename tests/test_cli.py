"""The command line as a user meets it. Most cases run in-process through `run_cli` (the same single error-mapping
place as the console entry point); a few run the real console entry point in a subprocess."""

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time

import torch
import typer

from fedl2p_cli.artifacts import Store
from fedl2p_cli.cli.main import app, run_cli
from fedl2p_cli.engine.loop import Checkpoint
from fedl2p_cli.io import weights

from .helpers import execute, old_meta


def cli(capsys, monkeypatch, store, *args):
    """Run `fedl2p ARGS` in-process against `store`: (exit code, stdout, stderr)."""
    monkeypatch.setenv("FEDL2P_STORE", str(store))
    monkeypatch.setenv("COLUMNS", "200")
    capsys.readouterr()
    code = run_cli([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def tree(root):
    """Every folder and every file's bytes under root: 'byte-identical before and after' compares these."""
    if not root.exists():
        return None
    return sorted((str(p.relative_to(root)), hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
                  for p in root.rglob("*"))


def toml(tmp, name, text):
    p = tmp / f"{name}.toml"
    p.write_text(text)
    return p


def cases(tmp):
    bad_init = tmp / "bad.pt"
    torch.save({"weight": torch.zeros(3)}, bad_init)
    pickle = tmp / "evil.pt"
    pickle.write_bytes(b"\x80\x04\x95\x15\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94\x93\x94.")
    return [
        # partition: types, finiteness and ranges, all from the config dataclass
        (["partition", "--alpha", "0"], "--alpha must be > 0"),
        (["partition", "--alpha", "nan"], "--alpha must be a finite number"),
        (["partition", "--alpha", "inf"], "--alpha must be a finite number"),
        (["partition", "--alpha", "-1"], "--alpha must be > 0"),
        (["partition", "--clients", "0"], "--clients must be >= 1"),
        (["partition", "--samples-per-client", "2"], "--samples-per-client must be >= 3"),
        (["partition", "--val-fraction", "1"], "--val-fraction must be in [0, 1)"),
        (["partition", "--test-fraction", "0"], "--test-fraction must be in (0, 1)"),
        (["partition", "--severity", "9", "--dataset", "digits-c"], "--severity must be in [1, 5]"),
        (["partition", "--dataset", "digits", "--clients", "1000", "--samples-per-client", "100"], "lower --clients"),
        (["partition", "--dataset", "nope"], "unknown dataset"),
        (["partition", "--dataset", "digits-c", "--corruptions", "clean,fog"], "unknown corruption"),
        (["partition", "--dataset", "cifar10", "--data-dir", tmp / "missing"], "CIFAR-10 not found"),
        (["partition", "--dataset", "image-folder", "--data-dir", tmp / "missing"], "image-folder needs"),
        (["partition", "--dataset", "fmnist", "--data-dir", tmp / "missing"], "does not exist"),
        (["partition", "--dataset", "digits", "--exclude", "zzzz"], "no partition artifact with id"),
        # per-domain options: format, range, domain names, where they apply
        (["partition", "--dataset", "digits-c", "--domain-alpha", "clean"], "--domain-alpha takes domain=value pairs"),
        (["partition", "--dataset", "digits-c", "--domain-alpha", "clean=x"], "--domain-alpha takes domain=value pairs"),
        (["partition", "--dataset", "digits-c", "--domain-alpha", "clean=0"], "--domain-alpha must be > 0"),
        (["partition", "--dataset", "digits-c", "--domain-alpha", "clean=nan"], "--domain-alpha must be a finite number"),
        (["partition", "--dataset", "digits-c", "--domain-samples", "clean=2"], "--domain-samples must be >= 3"),
        (["partition", "--dataset", "digits-c", "--domain-severity", "invert=6"], "--domain-severity must be in [1, 5]"),
        (["partition", "--dataset", "digits-c", "--corruptions", "clean,invert", "--domain-alpha", "fog=1"],
         "--domain-alpha names 'fog', not a domain of this partition (clean, invert)"),
        (["partition", "--dataset", "digits-c", "--scheme", "shards", "--domain-alpha", "clean=1"], "--scheme shards has none"),
        (["partition", "--dataset", "digits", "--domain-severity", "all=2"], "--domain-severity applies to generated"),
        (["partition", "--dataset", "digits-c", "--clients", "7", "--domain-samples", "clean=5000"], "lower --clients"),
        # pretrain
        (["pretrain", "--from", "zzzz"], "no partition artifact with id"),
        (["pretrain", "--algo", "sgd"], "unknown algorithm"),
        (["pretrain", "--model", "vgg"], "unknown model"),
        (["pretrain", "--rounds", "0"], "--rounds must be >= 1"),
        (["pretrain", "--lr", "nan"], "--lr must be a finite number"),
        (["pretrain", "--lr", "0"], "--lr must be > 0"),
        (["pretrain", "--fraction", "1.5"], "--fraction must be in (0, 1]"),
        (["pretrain", "--eval-every", "0"], "--eval-every must be >= 1"),
        (["pretrain", "--batch-size", "1"], "--batch-size must be >= 2"),
        (["pretrain", "--init", bad_init], "do not fit model"),
        (["pretrain", "--init", pickle], "not a weights-only state dict"),
        (["pretrain", "--init", tmp / "none.pt"], "--init file not found"),
        # stats
        (["stats", "--batch-size", "0"], "--batch-size must be >= 1"),
        (["stats", "--pretrain", "zzzz"], "no pretrain artifact"),
        # meta-train
        (["meta-train", "--base-lr", "-0.1"], "--base-lr must be > 0"),
        (["meta-train", "--batch-size", "0"], "--batch-size must be >= 2"),
        (["meta-train", "--beta", "2"], "--beta must be in [0, 1]"),
        (["meta-train", "--psi", "0"], "--psi must be > 0"),
        (["meta-train", "--server-lr", "inf"], "--server-lr must be a finite number"),
        (["meta-train", "--iterations", "0"], "--iterations must be >= 1"),
        (["meta-train", "--patience", "-1"], "--patience must be >= 0"),
        (["meta-train", "--client-bn", "stale"], "unknown --client-bn"),
        (["meta-train", "--meta-opt", "adamw"], "unknown server step 'adamw' (--meta-opt)"),
        (["meta-train", "--ift-at", "first"], "unknown --ift-at"),
        (["meta-train", "--val-stats", "batch"], "unknown --val-stats"),
        (["meta-train", "--psi-power", "-1"], "--psi-power must be >= 0"),
        (["meta-train", "--nets", "all"], "unknown --nets"),
        (["meta-train", "--stats", "zzzz"], "no stats artifact"),
        (["meta-train", "--beta-init", "1.5"], "--beta-init must be in [0, 1]"),
        # partition schemes and the other personalised-FL systems
        (["partition", "--scheme", "pathological"], "unknown --scheme"),
        (["partition", "--dataset", "digits", "--scheme", "shards", "--shard-classes", "11"], "--shard-classes must be in 1..10"),
        (["partition", "--dataset", "digits-c", "--corruptions", "rotateX"], "unknown corruption"),
        (["pfl-train", "--algo", "fedprox"], "unknown pFL system"),
        (["pfl-train", "--order", "third"], "unknown --order"),
        (["pfl-train", "--k", "0"], "--k must be >= 1"),
        (["pfl-train", "--hn-lr", "nan"], "--hn-lr must be a finite number"),
        (["pfl-train", "--partition", "zzzz"], "no partition artifact"),
        (["personalize", "--methods", "ft-bnc,cafeme"], "has no pfl artifact"),
        (["personalize", "--pfl-steps", "0"], "--pfl-steps must be >= 1"),
        (["run", toml(tmp, "pfl_algo", '[partition]\n[pretrain]\n[[pfl]]\nalgo = "x"\n')], "unknown pFL system"),
        # personalize
        (["personalize", "--client-bn", "stale"], "unknown --client-bn"),
        (["personalize", "--eval-stats", "batch"], "unknown --eval-stats"),
        (["personalize", "--methods", "ft-bnc,magic"], "unknown method"),
        (["personalize", "--seeds", "a,b"], "expected comma-separated integers"),
        (["personalize", "--seeds", "-1"], "--seeds must be >= 0"),
        (["personalize", "--epochs", "0"], "--epochs must be >= 1"),
        # analyze and artifacts
        (["analyze", "clusters", "--method", "no-such"], "has no learned beta/eta"),
        (["artifacts", "show", "nostage"], "unknown stage"),
        # pipeline files: everything validated before the first stage runs
        (["run", tmp / "nope.toml"], "pipeline file not found"),
        # the device: the global option and a pipeline file's key
        (["--device", "tpu", "stats"], "--device 'tpu' is not a device"),
        (["--device", "cuda:x", "stats"], "--device 'cuda:x' is not a device"),
        (["run", toml(tmp, "dev_type", 'device = 1\n[partition]\n[pretrain]\n')], "device must be a string"),
        (["run", toml(tmp, "dev_bad", 'device = "tpu"\n[partition]\n[pretrain]\n')], "--device 'tpu' is not a device"),
        (["run", toml(tmp, "str_alpha", '[partition]\nalpha = "0.5"\n[pretrain]\n')], "[partition] alpha must be a number"),
        (["run", toml(tmp, "section_str", 'meta-train = "fast"\n[partition]\n[pretrain]\n')], "[meta-train] must be a table"),
        (["run", toml(tmp, "late_typo", '[partition]\n[pretrain]\n[personalize]\nepochs = 0\n')], "[personalize] epochs must be >= 1"),
        (["run", toml(tmp, "nan_lr", '[partition]\n[pretrain]\nlr = nan\n')], "[pretrain] lr must be a finite number"),
        (["run", toml(tmp, "bad_key", '[partition]\nalpah = 1\n[pretrain]\n')], "unknown key 'alpah'"),
    ]


def test_bad_input_gives_one_line_and_leaves_the_store_as_it_was(tiny_store, tmp_path, capsys, monkeypatch):
    root = tiny_store["store"].root
    before = tree(root)
    monkeypatch.chdir(tmp_path)  # a stray relative ./artifacts would show up here
    for args, expect in cases(tmp_path):
        code, out, err = cli(capsys, monkeypatch, root, *args)
        assert code == 2, (args, code, err)
        assert "Traceback" not in out + err, (args, err)
        assert len(err.strip().splitlines()) == 1 and expect in err, (args, err)
        assert tree(root) == before, args
    assert not (tmp_path / "artifacts").exists()


def test_refused_in_an_empty_store_creates_nothing(tmp_path, capsys, monkeypatch):
    store = tmp_path / "fresh"
    for args in (["partition", "--alpha", "nan"], ["pretrain", "--from", "zzzz"], ["meta-train", "--beta", "2"]):
        code, _, _ = cli(capsys, monkeypatch, store, *args)
        assert code == 2 and not store.exists(), args


def test_ambiguous_prefix_and_missing_file(tiny_store, tmp_path, capsys, monkeypatch):
    root = tmp_path / "store"
    shutil.copytree(tiny_store["store"].root, root)
    ids = Store(root).ids("meta-train")
    prefixes = {}
    for i in ids:
        prefixes.setdefault(i[0], []).append(i)
    shared = next((p for p, v in prefixes.items() if len(v) > 1), None)
    if shared is None:  # make two ids share a prefix by copying one under a lookalike name
        src = Store(root).load("meta-train", ids[0])
        twin = root / "meta-train" / (ids[0][:11] + ("0" if ids[0][11] != "0" else "1"))
        shutil.copytree(src.path, twin)
        shared = ids[0][:11]
    code, _, err = cli(capsys, monkeypatch, root, "personalize", "--meta", shared)
    assert code == 2 and "ambiguous" in err and len(err.strip().splitlines()) == 1
    pre = Store(root).load("pretrain", tiny_store["pretrain"].id)
    (pre.path / "model.safetensors").unlink()
    code, _, err = cli(capsys, monkeypatch, root, "stats", "--pretrain", pre.id, "--force")
    assert code == 2 and "is missing 'model.safetensors'" in err


def test_every_option_has_help():
    cmd = typer.main.get_command(app)
    seen = 0
    for name, sub in cmd.commands.items():
        for leaf in getattr(sub, "commands", {name: sub}).values():
            for p in leaf.params:
                if p.name in ("help",):
                    continue
                seen += 1
                assert (getattr(p, "help", None) or "").strip(), f"{leaf.name}: option {p.name} has no help text"
    assert seen > 60  # every command's options were walked


def test_verify_reports_an_edited_file(tiny_store, tmp_path, capsys, monkeypatch):
    root = tmp_path / "store"
    shutil.copytree(tiny_store["store"].root, root)
    code, out, _ = cli(capsys, monkeypatch, root, "artifacts", "verify")
    assert code == 0 and "FAIL" not in out and tiny_store["meta"].id in out
    hist = Store(root).load("meta-train", tiny_store["meta"].id).path / "history.csv"
    hist.write_text(hist.read_text() + "\n")
    code, out, _ = cli(capsys, monkeypatch, root, "artifacts", "verify")
    assert code == 1 and "FAIL" in out and "history.csv" in out


# -- the real console entry point (a subprocess each: kept few, they cost a Python start with torch) -------------

def fedl2p(*args, store, **kw):
    env = dict(os.environ, FEDL2P_STORE=str(store), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "fedl2p_cli", *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=300, **kw)


def test_console_entry_point_maps_errors_and_help(tiny_store, tmp_path):
    r = fedl2p("partition", "--alpha", "nan", store=tmp_path / "s")
    assert r.returncode == 2 and r.stderr.strip() == "error: --alpha must be a finite number, got nan"
    assert not (tmp_path / "s").exists()
    r = fedl2p("meta-train", "--help", store=tmp_path / "s")
    assert r.returncode == 0 and "--psi-power" in r.stdout
    # a pickle that is not weights-only: torch's own warning about its protocol must not reach the user's terminal
    evil = tmp_path / "evil.pt"
    evil.write_bytes(b"\x80\x04\x95\x15\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94\x93\x94.")
    r = fedl2p("pretrain", "--init", evil, store=tiny_store["store"].root)
    assert r.returncode == 2 and r.stderr.strip() == f"error: --init {evil} is not a weights-only state dict (UnpicklingError)"


def test_sigkill_during_meta_train_then_rerun_is_bit_identical(tiny_store, tmp_path):
    """kill -9 after a round checkpoint, run the same command again: same id, same lambda bytes as an
    uninterrupted run, and nothing temporary left in the store."""
    ids = {"--pretrain": tiny_store["pretrain"].id, "--stats": tiny_store["stats"].id}
    args = ["meta-train", "--preset", "fomaml", "--rounds", "6", "--fraction", "0.5", "--epochs", "1", "--batch-size",
            "16", "--base-lr", "0.01", "--seed", "3", *[x for kv in ids.items() for x in kv]]
    ref_root, kill_root = tmp_path / "ref", tmp_path / "kill"
    shutil.copytree(tiny_store["store"].root, ref_root)
    shutil.copytree(tiny_store["store"].root, kill_root)
    # the uninterrupted reference in-process (a run is bit-identical across processes; the ids must agree)
    from fedl2p_cli.stages import meta_train
    ref_cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=6, fraction=0.5, seed=3,
                                                meta=old_meta(epochs=1, batch_size=16, base_lr=0.01))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the CLI (--threads 1): float reductions depend on the thread count
    try:
        ref_id = execute(meta_train, ref_cfg, Store(ref_root), {k[2:]: v for k, v in ids.items()})[0].id
    finally:
        torch.set_num_threads(threads)
    env = dict(os.environ, FEDL2P_STORE=str(kill_root))
    err = tmp_path / "stderr.txt"  # what the run said, should it end before it is killed
    with open(err, "w") as err_file:
        proc = subprocess.Popen([sys.executable, "-m", "fedl2p_cli", *args], env=env, stdout=subprocess.DEVNULL,
                                stderr=err_file, start_new_session=True)
    ckpt = Checkpoint(Store(kill_root).workdir("meta-train", ref_id))
    deadline = time.time() + 240
    try:
        while time.time() < deadline and proc.poll() is None:
            # read the published checkpoint only: `Checkpoint.load` also deletes a `.part` left by a kill, which here
            # would be the running process's write in flight (it holds the lock, this test does not)
            path = ckpt.folder / Checkpoint.NAME
            if path.is_file() and weights.load_with_meta(path)[1]["next_round"] >= 2:
                break
            time.sleep(0.05)
        said = err.read_text()[-2000:]
        assert proc.poll() is None, f"meta-train ended before it could be killed (finished: raise --rounds): {said}"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not Store(kill_root).exists("meta-train", ref_id)
    r = fedl2p(*args, store=kill_root)
    assert r.returncode == 0, r.stderr
    assert Store(kill_root).ids("meta-train") == Store(ref_root).ids("meta-train")  # the same artifact id as the reference
    got = Store(kill_root).load("meta-train", ref_id)
    ref = Store(ref_root).load("meta-train", ref_id)
    assert got.file("lambda.safetensors").read_bytes() == ref.file("lambda.safetensors").read_bytes()
    assert history_without_times(got) == history_without_times(ref)  # every reported number too (gnorm_*), not only lambda
    lam = weights.load(got.file("lambda.safetensors"))
    assert lam and all(torch.isfinite(v).all() for v in lam.values())
    leftovers = [p.name for p in (kill_root / "meta-train").iterdir() if p.name.startswith(".")]
    assert leftovers == [], leftovers


def history_without_times(art) -> list[dict]:
    import csv
    with open(art.file("history.csv")) as f:
        return [{k: v for k, v in row.items() if not k.endswith("_s")} for row in csv.DictReader(f)]


def test_two_processes_asking_for_one_artifact_build_it_once(tiny_store, tmp_path):
    """Two real processes run the same meta-train at once: the second waits for the first's build lock (saying so,
    once), then reuses its artifact; with --lock-timeout it gives up after that many seconds, in one line."""
    root = tmp_path / "store"
    shutil.copytree(tiny_store["store"].root, root)
    args = ["meta-train", "--rounds", "120", "--fraction", "0.5", "--epochs", "1", "--batch-size", "16", "--base-lr", "0.01",
            "--seed", "4", "--pretrain", tiny_store["pretrain"].id, "--stats", tiny_store["stats"].id]
    env = dict(os.environ, FEDL2P_STORE=str(root), COLUMNS="200")
    cmd = [sys.executable, "-m", "fedl2p_cli", *args]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        while not any((root / "meta-train").glob(".work-*")) and time.time() < deadline and first.poll() is None:
            time.sleep(0.05)  # the first holds the lock once its checkpoint folder exists
        assert first.poll() is None, "the first process finished before the second could ask; raise --rounds"
        waiters = [subprocess.Popen([sys.executable, "-m", "fedl2p_cli", *pre, *args], env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for pre in (["--lock-timeout", "0.3"], [])]
        impatient, second = [(w.wait(timeout=240), *w.communicate()) for w in waiters]
        out1, err1 = first.communicate(timeout=240)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert impatient[0] == 2 and impatient[2].strip().endswith("gave up waiting after 0.3 s (--lock-timeout)")
    assert first.returncode == 0 and "wrote" in out1 and "waiting" not in err1
    assert second[0] == 0 and "reused" in second[1], second
    assert second[2].count("waiting for another fedl2p process building meta-train/") == 1
    assert len(Store(root).ids("meta-train")) == len(tiny_store["store"].ids("meta-train")) + 1
