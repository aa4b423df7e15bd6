"""Meta-train modes at the stage level (L2P, FOMAML+, one net, K > 1, patience, --no-resume) and the store's
crash hygiene (stale temporary folders, one builder per artifact)."""

import csv
import fcntl
import math
import os

import pytest
import torch

from fedl2p_cli.artifacts import Store, artifact_id
from fedl2p_cli.engine.loop import Checkpoint, LoopState
from fedl2p_cli.errors import ArtifactError
from fedl2p_cli.io import weights
from fedl2p_cli.runtime import Runtime
from fedl2p_cli.stages import meta_train
from fedl2p_cli.stages.common import build_or_reuse

from .conftest import TINY_META
from .helpers import KillAfter, Killed, execute, handed, old_meta


def run(tiny, cfg, **kw):
    return execute(meta_train, cfg, tiny["store"], {"pretrain": tiny["pretrain"].id, "stats": tiny["stats"].id},
                   **kw)


def lam_of(art):
    return weights.load(art.file("lambda.safetensors"))


def history(art):
    return list(csv.DictReader(open(art.file("history.csv"))))


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_l2p_end_to_end_and_resume_after_a_kill(tiny_store):
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=4, fraction=0.5, local=True, seed=5, meta=TINY_META)
    full, _ = run(tiny_store, cfg)
    lam = lam_of(full)
    seen = sorted({int(k.split(".")[0][6:]) for k in lam})
    assert full.metrics["variant"] == "l2p-seed5" and len(seen) >= 3  # one lambda per seen client
    assert all(torch.isfinite(v).all() for v in lam.values())
    with pytest.raises(Killed):
        run(tiny_store, cfg, force=True, progress=KillAfter(2))
    assert Checkpoint(tiny_store["store"].workdir("meta-train", full.id)).load().next_round == 2
    resumed, _ = run(tiny_store, cfg, force=True)
    assert same(lam, lam_of(resumed))
    assert [r["val_loss"] for r in history(full)] == [r["val_loss"] for r in history(resumed)]


def test_no_resume_ignores_a_checkpoint(tiny_store):
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5, seed=11, meta=TINY_META)
    full, _ = run(tiny_store, cfg)
    ck = Checkpoint(tiny_store["store"].workdir("meta-train", full.id))
    poisoned = {f"{p}.{k}": torch.zeros_like(v) for k, v in lam_of(full).items() for p in ("lam", "best")}
    ck.save(LoopState(1, poisoned, [], {"best_val": -1.0, "best_round": 1, "stale": 0, "diverged": None}))
    fresh, _ = run(tiny_store, cfg, force=True, resume=False)
    assert same(lam_of(full), lam_of(fresh))
    ck.save(LoopState(1, poisoned, [], {"best_val": -1.0, "best_round": 1, "stale": 0, "diverged": None}))
    resumed, _ = run(tiny_store, cfg, force=True)  # the default resumes: the poisoned best (val -1) is kept
    assert all((v == 0).all() for v in lam_of(resumed).values())


@pytest.mark.parametrize("variant", ["fomaml", "bnnet", "lrnet", "k2"])
def test_meta_variants_run_and_learn_what_they_should(tiny_store, variant):
    meta = {"fomaml": old_meta(epochs=1, batch_size=16, base_lr=0.01, meta_grad="fomaml", beta_init=0.5),
            "k2": old_meta(epochs=1, batch_size=16, base_lr=0.01, iterations=2, meta_grad="ift", beta_init=0.5)}.get(variant, TINY_META)
    nets = variant if variant in ("bnnet", "lrnet") else "both"
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5, seed=2, nets=nets, meta=meta, keep="last")
    art, _ = run(tiny_store, cfg)
    base, _ = run(tiny_store, meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5, seed=2, meta=TINY_META, keep="last"))
    assert art.metrics["variant"] == {"fomaml": "fedl2p-fomaml", "bnnet": "fedl2p-bnnet", "lrnet": "fedl2p-lrnet-b1",
                                      "k2": "fedl2p"}[variant] + "-last-seed2"
    lam, lam_base = lam_of(art), lam_of(base)
    assert all(torch.isfinite(v).all() for v in lam.values()) and not same(lam, lam_base)
    rows = history(art)
    beta = [float(v) for r in rows for k, v in r.items() if k.startswith("beta_") and k[5:].isdigit()]
    eta = [float(v) for r in rows for k, v in r.items() if k.startswith("eta_") and k[4:].isdigit()]
    if variant == "bnnet":  # LRs fixed at the base LR
        assert eta and all(math.isclose(e, TINY_META.base_lr, rel_tol=1e-6) for e in eta)
    if variant == "lrnet":  # beta fixed at --beta 1
        assert beta and all(b == 1.0 for b in beta)
    if variant in ("fomaml", "k2"):
        assert len({round(b, 7) for b in beta}) > 1 and len({round(e, 9) for e in eta}) > 1


def test_patience_stops_exactly_when_the_rule_says(tiny_store):
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=8, fraction=0.5, seed=4, patience=1, meta=TINY_META)
    art, _ = run(tiny_store, cfg)
    losses = [float(r["val_loss"]) for r in history(art)]
    best, stale, expect = math.inf, 0, cfg.rounds
    for i, v in enumerate(losses):
        best, stale = (v, 0) if v < best else (best, stale + 1)
        if stale >= cfg.patience:
            expect = i + 1
            break
    assert art.metrics["rounds_run"] == expect == len(losses)
    assert expect < cfg.rounds, "this seed never went a round without improving; pick another"


def _dummy(draft):
    draft.path("x.txt").write_text("x")


def test_stale_temporary_folders_are_removed_and_live_ones_kept(tmp_path):
    store = Store(tmp_path)
    stage = tmp_path / "partition"
    dead, live = stage / ".tmp-deadbeef0000-abcd", stage / ".tmp-cafe00000000-efgh"
    for d in (dead, live):
        d.mkdir(parents=True)
        (d / "half.h5").write_bytes(b"half")
    unknown = stage / ".tmp-0123456789ab-ijkl"  # no lock file: a builder that takes none may be writing it
    unknown.mkdir()
    (stage / ".lock-deadbeef0000").touch()  # a killed builder leaves its lock file, unlocked
    fd = os.open(stage / ".lock-cafe00000000", os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a live builder of cafe00000000
    try:
        art, _ = build_or_reuse(store, "partition", {"a": 1}, {}, _dummy, False, handed())
    finally:
        os.close(fd)
    assert not dead.exists() and live.exists() and (live / "half.h5").read_bytes() == b"half" and unknown.exists()
    assert sorted(p.name for p in stage.iterdir()) == sorted([art.id, live.name, unknown.name, ".lock-cafe00000000"])


def test_a_second_builder_waits_up_to_its_timeout(tmp_path, capfd):
    store = Store(tmp_path)
    aid = artifact_id("partition", {"a": 2}, {})
    (tmp_path / "partition").mkdir()
    fd = os.open(tmp_path / "partition" / f".lock-{aid}", os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        with pytest.raises(ArtifactError, match=r"gave up waiting after 0.5 s \(--lock-timeout\)"):
            build_or_reuse(store, "partition", {"a": 2}, {}, _dummy, False, handed(lock_timeout=0.5))
    finally:
        os.close(fd)
    told = [line for line in capfd.readouterr().err.splitlines() if line.startswith("waiting")]
    assert len(told) == 1 and f"partition/{aid}" in told[0]
    art, reused = build_or_reuse(store, "partition", {"a": 2}, {}, _dummy, False, handed())
    assert not reused and art.id == aid


def test_two_workers_write_the_same_artifact_as_one(tiny_store, tmp_path):
    """--workers 2: a round's clients in two processes of one thread; same id, same lambda bytes, same history
    (apart from wall-clock columns) as one process at one thread."""
    import shutil
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5, seed=21, meta=TINY_META)
    roots = []
    for workers in (1, 2):
        root = tmp_path / f"w{workers}"
        shutil.copytree(tiny_store["store"].root, root)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            art, _ = execute(meta_train, cfg, Store(root),
                             {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id}, runtime=Runtime(workers=workers))
        finally:
            torch.set_num_threads(threads)
        roots.append(art)
    one, two = roots
    assert one.id == two.id
    assert one.file("lambda.safetensors").read_bytes() == two.file("lambda.safetensors").read_bytes()
    strip = lambda rows: [{k: v for k, v in r.items() if not k.endswith("_s")} for r in rows]  # noqa: E731
    assert strip(history(one)) == strip(history(two))


def test_pretraining_with_two_workers_writes_the_same_model(tiny_store, tmp_path):
    """pretrain --workers 2 runs through the same round loop and ClientPool: same id, same weights."""
    from fedl2p_cli.stages import pretrain

    from .conftest import TINY_PRETRAIN
    arts = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for workers in (1, 2):
            store = Store(tmp_path / f"p{workers}")
            store.root.mkdir(parents=True, exist_ok=True)
            import shutil
            shutil.copytree(tiny_store["store"].root / "partition", store.root / "partition")
            cfg = pretrain.PretrainConfig(**TINY_PRETRAIN)
            arts.append(execute(pretrain, cfg, store,
                                {"partition": tiny_store["partition"].id}, plot=False, runtime=Runtime(workers=workers))[0])
    finally:
        torch.set_num_threads(threads)
    assert arts[0].id == arts[1].id == tiny_store["pretrain"].id
    # (the fixture's own model may have been trained at two threads: compared by id only)
    assert arts[0].file("model.safetensors").read_bytes() == arts[1].file("model.safetensors").read_bytes()
