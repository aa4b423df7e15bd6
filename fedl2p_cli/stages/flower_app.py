"""FedL2P meta-training as a deployable Flower app (`flwr run flower_app`): one SuperNode per client site.

In deployment a site holds only its own data: `site.safetensors` in the folder its SuperNode is started with
(`--node-config "site-dir='/path'"`), with its normalised train and validation tensors and its client id. Each
`train` Message carries the pretrained weights, lambda, the round and the meta-train settings; the site computes its
own statistics (Alg. 1 lines 6-7: `core.stats.client_stats` under the received weights, the same function the
`stats` stage applies to every client centrally), runs the same client update as the other engines with its own
generator (seed, round, client), and replies with its result. The ServerApp asks every node for its client id once,
then runs the same `MetaStrategy` through the same round loop (`engine.rounds`), and writes lambda and the history to
the run's `out` folder. It needs no central statistics: the per-domain beta snapshot is left out of its history.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import time
from pathlib import Path

import torch

from .. import device, plugins
from ..algorithms.fedl2p import MetaConfig, client_update
from ..core.client import ClientData
from ..core.finetune import ClientBN
from ..core.functional import set_state
from ..core.stats import client_stats
from ..engine.flower import exchange, records, unrecord, wait_nodes
from ..engine.loop import Checkpoint, generator
from ..engine.rounds import run_rounds
from ..errors import FedL2PError
from ..io import weights
from ..models import registry
from ..runtime import Runtime
from . import meta_train as mt
from .common import NoProgress
from .pretrain import write_history

SITE_FILE = "site.safetensors"


def export_site(data: ClientData, client: int, folder: Path) -> Path:
    """Write one client's site folder (what a real site prepares from its own data, normalised as the model's
    pretraining data was)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SITE_FILE
    weights.save(path, {"x_train": data.train[0], "y_train": data.train[1], "x_val": data.val[0], "y_val": data.val[1]},
                 {"client": str(client)})
    return path


def run_config(store, pretrain_ref: str | None, cfg: "mt.MetaTrainConfig", sites: int, out: Path,
               runtime: Runtime = Runtime()) -> dict:
    """The app's run config for `flwr run --run-config`: the meta-train settings, the runtime (its failure policy; each
    site receives it whole and computes on its own device), the model's shape, and a copy of the pretrained weights
    the ServerApp sends to every site (written to `out`/model.safetensors)."""
    from ..core.bn import bn_layers
    from ..core.stats import stat_layers
    from . import pretrain as pretrain_stage
    if cfg.input_norm != "none" or cfg.local:
        raise FedL2PError("a deployment has no central statistics: use --input-norm none, and no --local")
    art, model, state = pretrain_stage.load(store, pretrain_ref)
    out.mkdir(parents=True, exist_ok=True)
    weights.save(out / "model.safetensors", state, {"pretrain": art.id})
    c = art.config
    spec = {"model": c["model"], "in_channels": c["in_channels"], "num_classes": c["num_classes"], "seed": c["seed"],
            "params": [n for n, _ in model.named_parameters()], "n_bn": len(bn_layers(model)),
            "n_x": 2 * len(stat_layers(model)), "pretrain": art.id, "plugins": plugins.active()}
    return {"meta-train": json.dumps(dataclasses.asdict(cfg)), "runtime": json.dumps(runtime.to_dict()),
            "model": json.dumps(spec),
            "model-file": str((out / "model.safetensors").resolve()), "sites": sites, "out": str(out.resolve())}


def load_site(folder: str) -> tuple[int, ClientData]:
    path = Path(folder) / SITE_FILE
    if not path.is_file():
        raise FedL2PError(f"site-dir '{folder}' has no {SITE_FILE}")
    t, meta = weights.load_with_meta(path)
    empty = (t["x_train"][:0], t["y_train"][:0])
    return int(meta["client"]), ClientData((t["x_train"], t["y_train"]), (t["x_val"], t["y_val"]), empty)


def site_update(folder: str, spec: dict, theta: dict, lam: dict, rnd: int, cfg_dict: dict, runtime: Runtime):
    """One site's meta-train client update, from its own data and statistics, on the runtime's device (the site's own:
    `site_runtime`). The reply goes back from the CPU."""
    runtime.apply(threads=1)
    dev = runtime.torch_device
    plugins.load(spec.get("plugins", []), "the run config's plugins")  # a site knows the server's models
    c, data = load_site(folder)
    model = registry.build(spec["model"], spec["in_channels"], spec["num_classes"], spec["seed"])
    set_state(model, theta)
    model.to(dev).eval()
    data, theta, lam = device.move((data, theta, lam), dev)
    st = client_stats(model, data.train[0])
    theta_g = {n: theta[n] for n, _ in model.named_parameters()}
    meta = MetaConfig(**cfg_dict["meta"])
    return device.to_host(mt.guarded(c, lambda timer: client_update(
        model, theta_g, lam, st.xi, st.x, ClientBN(st.bn_mean, st.bn_var), data, meta,
        generator(cfg_dict["seed"], rnd, c), timer)))


FAULTS = ("nan", "shape", "scale100")


def misbehave(done: "mt.MetaReply", lam: dict, fault: str) -> "mt.MetaReply":
    """A site's reply spoiled on purpose (node-config `fault`), to rehearse the server's defences on a real
    federation: nan = non-finite learning rates, shape = a meta-net weight of the wrong shape, scale100 = an update
    100 times the site's real one. Never set in a real deployment."""
    from dataclasses import replace
    r = done.result
    if r is None:  # a diverged client's message: nothing to spoil
        return done
    if fault == "nan":
        new = dict(r.lam, eta=torch.full_like(r.lam["eta"], float("nan")))
    elif fault == "shape":
        k = next(k for k, v in r.lam.items() if v.dim() == 2)
        new = dict(r.lam, **{k: r.lam[k][:, :1].contiguous()})
    elif fault == "scale100":
        new = {k: lam[k] + 100.0 * (v - lam[k]) for k, v in r.lam.items()}
    else:
        raise FedL2PError(f"unknown node-config fault '{fault}'; choose one of: {', '.join(FAULTS)}")
    return replace(done, result=replace(r, lam=new))


def site_runtime(sent: dict, node_config) -> Runtime:
    """The runtime the server sent, on the site's own device: the SuperNode's node-config `device`, else its
    FEDL2P_DEVICE, else auto."""
    where = str(node_config.get("device", os.environ.get(device.ENV, "auto")))
    return Runtime.from_dict(sent).replace(device=str(device.resolve(where)))


def _client_app():
    from flwr.app import ConfigRecord, Message, RecordDict
    from flwr.clientapp import ClientApp
    app = ClientApp()

    @app.query()
    def query(msg, context):
        c, _ = load_site(str(context.node_config["site-dir"]))
        return Message(RecordDict({"site": ConfigRecord({"client": c})}), reply_to=msg)

    @app.train()
    def train(msg, context):
        spec, theta, lam, rnd, cfg_dict, sent = unrecord(msg.content)
        done = site_update(str(context.node_config["site-dir"]), spec, theta, lam, rnd, cfg_dict,
                           site_runtime(sent, context.node_config))
        if "fault" in context.node_config:
            done = misbehave(done, lam, str(context.node_config["fault"]))
        return Message(records(done), reply_to=msg)

    return app


class _Sites:
    """The server's view of the federation: which client ids the SuperNodes hold (no data)."""

    def __init__(self, ids: list[int]):
        self.ids = ids

    def pool(self, unseen: bool) -> list[int]:
        return [] if unseen else list(self.ids)


def import_run(store, out: Path) -> tuple:
    """A deployment's result (`out`: the run config's folder, holding run.toml, lambda.safetensors and history.csv)
    as a meta-train artifact of the pretrained model it started from, usable by `personalize --meta ID`. Its id hashes
    the settings, the pretrained model and the lambda's sha256 (a federation's result is not reproducible from its
    settings alone: it depends on the sites)."""
    import tomllib
    from ..artifacts import sha256_file
    from .common import build_or_reuse
    files = {n: out / n for n in ("run.toml", "lambda.safetensors", "history.csv")}
    missing = [n for n, p in files.items() if not p.is_file()]
    if missing:
        raise FedL2PError(f"{out} has no {missing[0]}: import the folder `flwr run` wrote its results to (the run config's out)")
    try:
        rc = tomllib.loads(files["run.toml"].read_text())
        cfg, spec = mt.config_from_dict(json.loads(rc["meta-train"])), json.loads(rc["model"])
    except (tomllib.TOMLDecodeError, KeyError, TypeError, json.JSONDecodeError) as e:
        raise FedL2PError(f"{files['run.toml']} is not a run config `fedl2p flower run-config` wrote ({e})") from None
    pre = store.load("pretrain", spec["pretrain"])
    lam = weights.load(files["lambda.safetensors"])
    want = mt.initial_lambda(cfg, spec["n_bn"], spec["n_x"], len(spec["params"]))
    if {k: tuple(v.shape) for k, v in lam.items()} != {k: tuple(v.shape) for k, v in want.items()}:
        raise FedL2PError(f"{files['lambda.safetensors']} does not hold the meta-nets of this run config")
    config = mt.identity(cfg) | {"deployment": {"sites": rc.get("sites"),
                                                         "lambda_sha256": sha256_file(files["lambda.safetensors"])}}
    with open(files["history.csv"]) as f:
        rounds = max(0, sum(1 for _ in f) - 1)

    def build(draft) -> None:
        weights.save(draft.path("lambda.safetensors"), lam, {"variant": cfg.variant()})
        draft.path("history.csv").write_bytes(files["history.csv"].read_bytes())
        draft.metrics = {"variant": cfg.variant(), "rounds_run": rounds, "engine": "flower deployment",
                         "sites": rc.get("sites"), "diverged": None}

    return build_or_reuse(store, "meta-train", config, {"pretrain": pre.id}, build)


def server_checkpoint(out: Path, rc) -> Path:
    """The ServerApp's round checkpoints: a folder under OUT named by a hash of the run config's settings, model and
    sites, so that only a re-run of the same run config resumes from it (a changed config starts afresh)."""
    import hashlib
    key = json.dumps({k: str(rc[k]) for k in ("meta-train", "model", "sites")}, sort_keys=True)
    return out / ".checkpoint" / hashlib.sha256(key.encode()).hexdigest()[:12]


class ServerLog(NoProgress):
    """The ServerApp's progress: one line per run in OUT/server.log saying where it started (what an operator, and
    the resume test, reads). The round loop reports the rounds a checkpoint had done as its first advance."""

    def __init__(self, path: Path):
        self.path, self.rounds, self.said = path, 0, False

    def start(self, description: str, total: int) -> None:
        self.rounds = total

    def advance(self, n: int = 1, **info) -> None:
        if not self.said:
            self.said = True
            with open(self.path, "a") as log:
                log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} run of {self.rounds} rounds, "
                          + (f"resuming after round {n}\n" if n else "from the start\n"))


def _server_app():
    from flwr.app import Message, RecordDict
    from flwr.serverapp import ServerApp
    app = ServerApp()

    @app.main()
    def main(grid, context):
        rc = context.run_config
        settings = json.loads(str(rc["meta-train"]))
        cfg = mt.config_from_dict(settings)
        # a run config written before the runtime had its own entry carried the failure policy in its settings
        runtime = Runtime.from_dict(json.loads(str(rc["runtime"])) if "runtime" in rc else settings)
        spec = json.loads(str(rc["model"]))
        theta = weights.load(Path(str(rc["model-file"])))
        out = Path(str(rc["out"]))
        nodes = wait_nodes(grid, int(rc["sites"]))
        replies = grid.send_and_receive([Message(RecordDict(), dst_node_id=n, message_type="query") for n in nodes])
        node_of = {int(r.content.config_records["site"]["client"]): r.metadata.src_node_id for r in replies}
        ctx = mt.Context(None, {n: theta[n] for n in spec["params"]}, _Sites(sorted(node_of)), None, cfg)
        lam0 = mt.initial_lambda(cfg, spec["n_bn"], spec["n_x"], len(spec["params"]))
        cfg_dict = dataclasses.asdict(cfg)

        def execute(tasks: list[mt.MetaTask]) -> list:
            return exchange(grid, [[spec, theta, t.lam, t.round, cfg_dict, runtime.to_dict()] for t in tasks],
                            [node_of[t.client] for t in tasks], runtime.timeout())

        ckpt = Checkpoint(server_checkpoint(out, rc))  # a ServerApp killed mid-run resumes here on the next `flwr run`
        out.mkdir(parents=True, exist_ok=True)
        st = run_rounds(mt.MetaStrategy(ctx, lam0), cfg.rounds, ckpt, ServerLog(out / "server.log"), execute,
                        runtime.policy())
        weights.save(out / "lambda.safetensors", mt.kept_lambda(cfg, st), {"variant": cfg.variant()})
        write_history(out / "history.csv", st.history)

    return app


if importlib.util.find_spec("flwr") is not None:  # the apps exist where the flower extra is installed
    server_app = _server_app()  # separate assignments: `flwr run` finds components by reading this file's AST
    client_app = _client_app()
