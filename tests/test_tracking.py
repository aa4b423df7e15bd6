"""--track: what TensorBoard and MLflow hold, read back with each library's own reader, equals history.csv; the
tracked run and the artifact name each other; tracking never enters an id; a missing extra is one line."""

from __future__ import annotations

import csv
import shutil

import pytest

from fedl2p_cli import tracking
from fedl2p_cli.artifacts import Store
from fedl2p_cli.runtime import Runtime
from fedl2p_cli.stages import meta_train, pretrain

from .conftest import TINY_META, TINY_PRETRAIN
from .helpers import execute


@pytest.fixture
def store_copy(tiny_store, tmp_path):
    """A store holding copies of the tiny store's partition, model and statistics (its own artifacts stay apart)."""
    store = Store(tmp_path / "store")
    for key, stage in (("partition", "partition"), ("pretrain", "pretrain"), ("stats", "stats")):
        shutil.copytree(tiny_store[key].path, store.root / stage / tiny_store[key].id)
    yield store, tiny_store


def numeric_history(art) -> list[dict[str, float]]:
    with open(art.file("history.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    out = []
    for r in rows:
        out.append({k: float(v) for k, v in r.items() if v not in ("", None) and _number(v)})
    return out


def _number(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


def build_tracked(store_copy, backend: str, uri) -> tuple:
    """A pretrain and a meta-train built while `backend` tracks into `uri`."""
    store, tiny = store_copy
    tracking.check(backend, str(uri))
    rt = Runtime(track=backend, track_uri=str(uri))
    pre, reused = execute(pretrain, pretrain.PretrainConfig(**(TINY_PRETRAIN | {"rounds": 2, "seed": 1})), store,
                          {"partition": tiny["partition"].id}, plot=False, runtime=rt)
    meta, _ = execute(meta_train, meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5, seed=1, meta=TINY_META), store,
                      {"pretrain": tiny["pretrain"].id, "stats": tiny["stats"].id}, runtime=rt)
    assert not reused
    return pre, meta


def test_tensorboard_holds_history_csv(store_copy, tmp_path):
    pytest.importorskip("tensorboard", reason="the [tensorboard] extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    arts = build_tracked(store_copy, "tensorboard", tmp_path / "runs")
    for art in arts:
        assert art.manifest["tracking"]["run"] == f"{art.stage}/{art.id}"  # the manifest names the run ...
        acc = EventAccumulator(str(tmp_path / "runs" / art.stage / art.id))  # ... and the run is named by the artifact
        acc.Reload()
        hist = numeric_history(art)
        cols = sorted({k for r in hist for k in r})
        assert {"round_s", "train_loss"} <= set(cols) and set(cols) <= set(acc.Tags()["scalars"])
        if art.stage == "meta-train":  # beta and eta summaries per layer
            assert any(c.startswith("beta_") for c in cols) and any(c.startswith("eta_") for c in cols)
        for c in cols:
            logged = {e.step: e.value for e in acc.Scalars(c)}
            want = {int(r["round"]): r[c] for r in hist if c in r}
            assert logged.keys() == want.keys(), c
            assert all(logged[s] == pytest.approx(want[s], rel=1e-6, abs=1e-9) for s in want), c  # event files: float32
        for k, v in art.metrics.items():
            if isinstance(v, (int, float)) and v is not None:
                assert acc.Scalars(f"summary/{k}")[0].value == pytest.approx(v, rel=1e-6)


def test_mlflow_holds_history_csv(store_copy, tmp_path):
    pytest.importorskip("mlflow", reason="the [mlflow] extra is not installed")
    from mlflow.tracking import MlflowClient
    arts = build_tracked(store_copy, "mlflow", tmp_path / "mlruns")
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    for art in arts:
        t = art.manifest["tracking"]
        run = client.get_run(t["run"])  # the manifest names the run, the run names the artifact
        assert run.data.tags["fedl2p.artifact_id"] == art.id and run.data.tags["fedl2p.stage"] == art.stage
        assert run.info.status == "FINISHED"
        hist = numeric_history(art)
        for c in sorted({k for r in hist for k in r}):
            logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, c)}
            assert logged == {int(r["round"]): r[c] for r in hist if c in r}, c  # float64: exact


def test_tracking_is_not_part_of_the_id(store_copy, tmp_path):
    pytest.importorskip("tensorboard", reason="the [tensorboard] extra is not installed")
    store, tiny = store_copy
    tracked = build_tracked(store_copy, "tensorboard", tmp_path / "runs")[0]
    other = Store(tmp_path / "other")
    shutil.copytree(tiny["partition"].path, other.root / "partition" / tiny["partition"].id)
    plain, _ = execute(pretrain, pretrain.PretrainConfig(**(TINY_PRETRAIN | {"rounds": 2, "seed": 1})), other,
                       {"partition": tiny["partition"].id}, plot=False)
    assert plain.id == tracked.id and "tracking" not in plain.manifest
    assert (other.root / "pretrain" / plain.id / "history.csv").read_bytes() != b""


def test_failed_and_dropped_clients_are_counted():
    s = tracking.scalars({"round": 3, "val_loss": 0.5, "failed": "client 1: timeout; client 4: crashed",
                          "dropped": "client 2: norm", "sampled": "1 2 4", "note": "x", "nan": float("nan")})
    assert s == {"round": 3.0, "val_loss": 0.5, "failed_clients": 2.0, "dropped_clients": 1.0}


def test_missing_extra_is_one_line(monkeypatch, capsys):
    import sys

    from fedl2p_cli.cli.main import run_cli
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow now fails as if it were not installed
    code = run_cli(["--track", "mlflow", "artifacts", "list"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["error: --track mlflow needs its extra: pip install 'fedl2p[mlflow]'"]
    assert run_cli(["--track", "wandb", "artifacts", "list"]) == 2
    assert "--track takes tensorboard or mlflow" in capsys.readouterr().err


def test_the_command_line_hands_track_to_a_partition(tmp_path):
    """`fedl2p --track tensorboard --track-uri DIR partition ...`: the command's Runtime carries --track to the build,
    whose manifest names the run (a command that computes on no device tracks too)."""
    pytest.importorskip("tensorboard", reason="the [tensorboard] extra is not installed")
    from fedl2p_cli.cli.main import run_cli
    store, runs = tmp_path / "store", tmp_path / "runs"
    assert run_cli(["--track", "tensorboard", "--track-uri", str(runs), "partition", "--dataset", "digits-c",
                    "--clients", "7", "--samples-per-client", "30", "--no-plot", "--store", str(store)]) == 0
    art = Store(store).load("partition")
    assert art.manifest["tracking"] == {"backend": "tensorboard", "uri": str(runs.resolve()), "run": f"partition/{art.id}"}
    assert art.manifest["computed_on"]["device"] == "cpu"
