"""Optional experiment tracking (`fedl2p --track tensorboard|mlflow`): every round a stage records (pretrain,
meta-train, pfl-train: the row history.csv gets) and every artifact's headline metrics (personalize: its summary),
logged to a local folder unless `--track-uri` names a server. Nothing here enters an artifact's id; the manifest
names the run (`tracking`) and the run names its artifact (TensorBoard: its folder `<stage>/<id>`; MLflow: run name
and the tags fedl2p.artifact_id / fedl2p.stage).

The trackers are optional extras, imported only when asked for: `pip install 'fedl2p[tensorboard]'` or
`'fedl2p[mlflow]'`.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import imports
from .errors import FedL2PError
from .runtime import Runtime

BACKENDS = ("tensorboard", "mlflow")
DEFAULT_URI = {"tensorboard": "runs", "mlflow": "mlruns"}  # each library's own default folder
EXPERIMENT = "fedl2p"
TEXT_KEYS = ("failed", "dropped")  # per-round strings: logged as a count of clients


def check(backend: str | None, uri: str | None = None) -> None:
    """--track and --track-uri, checked when the command starts (its library installed), before anything runs; the
    command's Runtime carries them (`track`, `track_uri`) to every build."""
    if backend is not None and backend not in BACKENDS:
        raise FedL2PError(f"--track takes {' or '.join(BACKENDS)}, got '{backend}'")
    if backend is None and uri is not None:
        raise FedL2PError("--track-uri needs --track tensorboard or --track mlflow")
    if backend is not None:
        _require(backend)


def _require(backend: str) -> None:
    module = {"tensorboard": "tensorboard", "mlflow": "mlflow"}[backend]
    try:
        imports.load(module, imports.Why.OPTIONAL)
    except ImportError:
        raise FedL2PError(f"--track {backend} needs its extra: pip install 'fedl2p[{backend}]'") from None


def scalars(rec: dict) -> dict[str, float]:
    """A round's record as numbers: its numeric columns, and each per-client string as a count of clients."""
    out = {k: float(v) for k, v in rec.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
           and math.isfinite(float(v))}
    out |= {f"{k}_clients": float(len(str(rec[k]).split("; "))) for k in TEXT_KEYS if rec.get(k)}
    return out


class TensorBoardRun:
    """Event files under `<uri>/<stage>/<id>/` (a resumed build appends to the same folder)."""

    def __init__(self, uri: str, stage: str, aid: str):
        from torch.utils.tensorboard import SummaryWriter
        self.dir = Path(uri) / stage / aid
        self.writer = SummaryWriter(log_dir=str(self.dir))
        self.writer.add_text("artifact", f"{stage}/{aid}", 0)
        self.info = {"backend": "tensorboard", "uri": str(Path(uri).resolve()), "run": f"{stage}/{aid}"}

    def log(self, values: dict[str, float], step: int) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)

    def close(self, ok: bool) -> None:
        self.writer.close()


class MLflowRun:
    """One MLflow run per artifact, in experiment "fedl2p"; a resumed build continues the run it started."""

    def __init__(self, uri: str, stage: str, aid: str):
        if "://" not in uri and not uri.startswith("file:"):  # a local folder: MLflow's file store
            uri = Path(uri).resolve().as_uri()
        if uri.startswith("file:"):  # MLflow 3 refuses its file store unless asked; a local folder is what we want
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(EXPERIMENT)
        eid = exp.experiment_id if exp else self.client.create_experiment(EXPERIMENT)
        old = self.client.search_runs([eid], filter_string=f"tags.`fedl2p.artifact_id` = '{aid}'", max_results=1)
        run = old[0] if old else self.client.create_run(eid, run_name=f"{stage}-{aid}",
                                                        tags={"fedl2p.artifact_id": aid, "fedl2p.stage": stage})
        self.run_id = run.info.run_id
        if old:
            self.client.update_run(self.run_id, status="RUNNING")
        self.info = {"backend": "mlflow", "uri": uri, "run": self.run_id, "run_name": f"{stage}-{aid}"}

    def log(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def close(self, ok: bool) -> None:
        self.client.set_terminated(self.run_id, status="FINISHED" if ok else "KILLED")


@dataclass
class RoundLogger:
    """A tracker run as a round observer: each round's numbers, at its round number."""
    run: Any

    def start(self, label: str, rounds: int, done: int) -> None:
        pass

    def round(self, label: str, rec: dict, st: Any, shown: dict) -> None:
        self.run.log(scalars(rec), int(rec.get("round", 0)))

    def stop(self) -> None:
        pass


def open_run(stage: str, aid: str, backend: str, uri: str | None) -> TensorBoardRun | MLflowRun:
    runs: dict[str, type[TensorBoardRun] | type[MLflowRun]] = {"tensorboard": TensorBoardRun, "mlflow": MLflowRun}
    cls = runs[backend]
    return cls(uri or DEFAULT_URI[backend], stage, aid)


@contextmanager
def tracked(stage: str, draft: Any, runtime: Runtime) -> Iterator[None]:
    """Around a build: its rounds go to the tracker as they happen, its headline metrics at the end (step 0, under
    "summary/"), and the draft's manifest names the run. Without a tracker (`runtime.track`): nothing."""
    if runtime.track is None:
        yield
        return
    run = open_run(stage, draft.id, runtime.track, runtime.track_uri)
    ok = False
    before = draft.observers
    draft.observers = (*before, RoundLogger(run))  # the build hands them to its rounds (stages.common.watch)
    try:
        yield
        run.log({f"summary/{k}": v for k, v in scalars(draft.metrics).items()}, 0)
        draft.tracking = run.info
        ok = True
    finally:
        draft.observers = before
        run.close(ok)
