"""FedL2P meta-training as a deployable Flower app (`fedl2p flower app DIR`, then `flwr run DIR`): one SuperNode per client site.

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
from typing import Any

import torch

from .. import plugins
from ..algorithms.fedl2p import MetaConfig, client_update
from ..algorithms.meta_loop import MetaReply, MetaStrategy, guarded, initial_lambda, kept_lambda
from ..catalog import META_HEAD, Catalog
from ..configs import MetaTrainConfig, config_from_dict
from ..core.client import ClientData
from ..core.finetune import ClientBN
from ..core.functional import set_state
from ..core.stats import client_stats
from ..device import ENV as DEVICE_ENV
from ..engine.loop import Checkpoint, generator
from ..engine.placement import OnDevice
from ..engine.rounds import run_rounds
from ..errors import FedL2PError
from ..io import weights
from ..models import registry
from ..protocols import Aggregator, ServerStep
from ..runtime import Runtime
from ..stages import meta_train as mt
from ..stages.pretrain import write_history
from .simulation import exchange, records, unrecord, wait_nodes
from .wire import plugin_roots

SITE_FILE = "site.safetensors"


def export_site(data: ClientData, client: int, folder: Path) -> Path:
    """Write one client's site folder (what a real site prepares from its own data, normalised as the model's
    pretraining data was)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SITE_FILE
    weights.save(path, {"x_train": data.train[0], "y_train": data.train[1], "x_val": data.val[0], "y_val": data.val[1]},
                 {"client": str(client)})
    return path


def run_config(store, pretrain_ref: str | None, cfg: MetaTrainConfig, sites: int, out: Path,
               runtime: Runtime, site_names: list[str] | None = None) -> dict:
    """The app's run config for `flwr run --run-config`: the meta-train settings, the runtime (its failure policy; each
    site receives it whole and computes on its own device), the model's shape, and a copy of the pretrained weights
    the ServerApp sends to every site (written to `out`/model.safetensors)."""
    from ..core.bn import bn_layers
    from ..core.stats import stat_layers
    from ..stages import pretrain as pretrain_stage
    if cfg.input_norm != "none":  # fitting one: every seen client's statistics in one place, which no server holds here
        raise FedL2PError(f"--input-norm {cfg.input_norm}: a deployment takes only 'none', since fitting any other "
                          "meta-inputs entry needs every seen client's statistics in one place, and each site keeps "
                          "its own")
    if cfg.local:
        raise FedL2PError("--local trains each client's meta-nets on its own, in one process: a deployment federates them")
    if site_names is not None and (len(site_names) != sites or len(set(site_names)) != sites):
        raise FedL2PError(f"--site-names must name --sites {sites} different sites, got {len(site_names)}: "
                          f"{', '.join(site_names)}")
    art, model, state = pretrain_stage.load(store, pretrain_ref, plugins.of(runtime))
    out.mkdir(parents=True, exist_ok=True)
    (out / ".gitignore").write_text("# weights, checkpoints and results of a deployment: never committed\n*\n")
    weights.save(out / "model.safetensors", state, {"pretrain": art.id})
    c = art.config
    spec = {"model": c["model"], "in_channels": c["in_channels"], "num_classes": c["num_classes"], "seed": c["seed"],
            "params": [n for n, _ in model.named_parameters()], "n_bn": len(bn_layers(model)),
            "n_x": 2 * len(stat_layers(model)), "pretrain": art.id, "plugins": plugins.of(runtime).active(),
            "site_input": site_input(store, art)}
    rc = {"meta-train": json.dumps(dataclasses.asdict(cfg)), "runtime": json.dumps(runtime.to_dict()),
          "model": json.dumps(spec),
          "model-file": str((out / "model.safetensors").resolve()), "sites": sites, "out": str(out.resolve())}
    return rc | {"site-names": json.dumps(site_names) if site_names is not None else ""}


def site_input(store, pretrain_art) -> dict:
    """What a site's `site.safetensors` must hold for this model: images [N, C, H, W] float32, standardised per
    channel with the pretraining data's mean and std ((pixel / 255 - mean) / std), labels int64 in 0..classes-1."""
    from ..stages import partition as partition_stage
    _, part = partition_stage.load(store, pretrain_art.parents["partition"])
    return {"shape": list(part.client(part.pool(False)[0]).train[0].shape[1:]), "mean": list(part.mean),
            "std": list(part.std), "classes": int(part.num_classes)}


def load_site(folder: str) -> tuple[int, ClientData]:
    path = Path(folder) / SITE_FILE
    if not path.is_file():
        raise FedL2PError(f"site-dir '{folder}' has no {SITE_FILE}")
    t, meta = weights.load_with_meta(path)
    client = weights.raw_metadata(path).get("client", meta.get("client"))  # as documented, or as export-site wrote
    want = {"x_train": torch.float32, "y_train": torch.int64, "x_val": torch.float32, "y_val": torch.int64}
    bad = [f"{k} ({t[k].dtype if k in t else 'missing'})" for k, d in want.items() if k not in t or t[k].dtype != d]
    if not bad and not str(client).isdigit():
        bad = [f"metadata 'client' ({client!r}: an integer as a string)"]
    if bad:
        raise FedL2PError(f"{path} is not a site file: {', '.join(bad)} (see docs/deployment.md, 'A site's data')")
    empty = (t["x_train"][:0], t["y_train"][:0])
    return int(str(client)), ClientData((t["x_train"], t["y_train"]), (t["x_val"], t["y_val"]), empty)


def site_name(node_config) -> str:
    """A site's name in the server's logs and history.csv: its node-config `site-name`, else its folder's name."""
    return str(node_config.get("site-name") or Path(str(node_config["site-dir"])).resolve().name)


def site_code(spec: dict, node_config, catalog: Catalog) -> list[str]:
    """The run's plugins, after checking that the site itself allows every module the run config asks it to import
    (its plugins, a `package.module:factory` model): node-config `allow-import` (comma-separated modules) or the
    site's FEDL2P_ALLOW_IMPORT (in the site's `catalog`). A server's text never chooses the code a site runs."""
    from ..models import guard
    mine = [m.strip() for m in str(node_config.get("allow-import", "")).split(",") if m.strip()]
    mine += guard.allowed_modules(catalog)
    model = str(spec["model"])
    asked = [*spec.get("plugins", []), *([model.partition(":")[0]] if ":" in model else [])]
    missing = [m for m in dict.fromkeys(asked) if not any(m == a or m.startswith(a + ".") for a in mine)]
    if missing:
        raise FedL2PError(f"the run asks this site to import {', '.join(missing)}: if the site trusts it, start its "
                          f"SuperNode with --node-config \"allow-import='{','.join(missing)}'\"")
    return list(spec.get("plugins", []))


def site_update(folder: str, spec: dict, theta: dict, lam: dict, rnd: int, cfg_dict: dict, runtime: Runtime,
                node_config=None):
    """One site's meta-train client update, from its own data and statistics, on the runtime's device (the site's own:
    `site_runtime`), where the executor puts the site's model, data and the server's message; the reply goes back
    from the CPU."""
    runtime.apply(threads=1)
    catalog = plugins.current()  # the site process's own (its entry point: the ClientApp); the run's plugins join it
    plugins.load(site_code(spec, node_config or {}, catalog), "the run config's plugins")  # the server's models
    c, data = load_site(folder)
    model = registry.build(spec["model"], spec["in_channels"], spec["num_classes"], spec["seed"], catalog=catalog)
    set_state(model, theta)
    meta = MetaConfig(**cfg_dict["meta"])

    def update(site: tuple, sent: tuple) -> MetaReply:
        (model, data), (theta, lam) = site, sent
        st = client_stats(model, data.train[0])
        theta_g = {n: theta[n] for n, _ in model.named_parameters()}
        return guarded(c, lambda timer: client_update(
            model, theta_g, lam, st.xi, st.x, ClientBN(st.bn_mean, st.bn_var), data, meta,
            generator(cfg_dict["seed"], rnd, c), timer, mt.meta_gradient_of(meta, catalog),
            catalog.get(META_HEAD, meta.head)))
    return OnDevice((model.eval(), data), runtime.torch_device)(update, (theta, lam))


def site_runtime(sent: dict, node_config) -> Runtime:
    """The runtime the server sent, on the site's own device: the SuperNode's node-config `device`, else its
    FEDL2P_DEVICE, else auto."""
    where = str(node_config.get("device", os.environ.get(DEVICE_ENV, "auto")))
    # the server's allow list is not the site's: what a site imports is its own choice (`site_code`)
    return Runtime.from_dict(sent).replace(device=where, allow_import=()).resolved()


def build_client_app(reply=None):
    """The site's ClientApp: `query` says which site it is, `train` runs the site's update. `reply(done, lam,
    node_config)`, if given, replaces each train reply before it is sent (the test suite's rehearsal app spoils
    replies with it, to exercise the server's defences; the production app passes none)."""
    from flwr.app import ConfigRecord, Message, RecordDict
    from flwr.clientapp import ClientApp
    app = ClientApp()

    @app.query()
    def query(msg, context):
        folder = str(context.node_config["site-dir"])
        c, _ = load_site(folder)
        return Message(RecordDict({"site": ConfigRecord({"client": c, "name": site_name(context.node_config)})}),
                       reply_to=msg)

    @app.train()
    def train(msg, context):
        # the site's own plugins (its entry point's catalog): whose dataclasses a task may hold
        spec, theta, lam, rnd, cfg_dict, sent = unrecord(msg.content, plugin_roots(plugins.current()))
        done = site_update(str(context.node_config["site-dir"]), spec, theta, lam, rnd, cfg_dict,
                           site_runtime(sent, context.node_config), context.node_config)
        if reply is not None:
            done = reply(done, lam, context.node_config)
        return Message(records(done), reply_to=msg)

    return app


@dataclasses.dataclass(frozen=True)
class _Sites:
    """The server's view of the federation (algorithms/meta_loop.py's `Federation`): the run's settings and server
    step, and which client ids the SuperNodes hold; no data, so no client's size and no snapshot of lambda."""
    cfg: MetaTrainConfig
    server_step: ServerStep
    aggregator: Aggregator
    ids: tuple[int, ...]

    def seen(self) -> list[int]:
        return list(self.ids)

    def train_size(self, c: int) -> int | None:
        return None  # a site's own

    def snapshot(self, lam: dict) -> dict:
        return {}  # the per-domain beta snapshot needs every client's statistics


def import_run(store, out: Path, runtime: Runtime) -> tuple:
    """A deployment's result (`out`: the run config's folder, holding run.toml, lambda.safetensors and history.csv)
    as a meta-train artifact of the pretrained model it started from, usable by `personalize --meta ID`. Its id hashes
    the settings, the pretrained model and the lambda's sha256 (a federation's result is not reproducible from its
    settings alone: it depends on the sites)."""
    import tomllib

    from ..artifacts import sha256_file
    from ..stages.common import build_or_reuse
    files = {n: out / n for n in ("run.toml", "lambda.safetensors", "history.csv")}
    missing = [n for n, p in files.items() if not p.is_file()]
    if missing:
        raise FedL2PError(f"{out} has no {missing[0]}: import the folder `flwr run` wrote its results to (the run config's out)")
    try:
        rc = tomllib.loads(files["run.toml"].read_text())
        cfg, spec = config_from_dict(json.loads(rc["meta-train"])), json.loads(rc["model"])
    except (tomllib.TOMLDecodeError, KeyError, TypeError, json.JSONDecodeError) as e:
        raise FedL2PError(f"{files['run.toml']} is not a run config `fedl2p flower run-config` wrote ({e})") from None
    catalog = plugins.of(runtime)  # the import command's
    pre = store.load("pretrain", spec["pretrain"], catalog=catalog)
    lam = weights.load(files["lambda.safetensors"])
    want = initial_lambda(cfg, catalog.get(META_HEAD, cfg.meta.head), spec["n_bn"], spec["n_x"], len(spec["params"]))
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

    return build_or_reuse(store, "meta-train", config, {"pretrain": pre.id}, build, False, runtime)


def server_checkpoint(out: Path, rc) -> Path:
    """The ServerApp's round checkpoints: a folder under OUT named by a hash of the run config's settings, model and
    sites, so that only a re-run of the same run config resumes from it (a changed config starts afresh)."""
    import hashlib
    key = json.dumps({k: str(rc[k]) for k in ("meta-train", "model", "sites", "site-names") if rc.get(k, "") != ""},
                     sort_keys=True)  # no site names: the key of a run config written before they existed
    return out / ".checkpoint" / hashlib.sha256(key.encode()).hexdigest()[:12]


class ServerLog:
    """What an operator watches, a round observer: OUT/server.log (and the ServerApp's stdout, which `flwr run
    --stream` shows) get a line where a run starts, one per finished round, and one where it ends; OUT/history.csv is
    rewritten atomically after every round."""

    def __init__(self, out: Path, rounds: int):
        self.out, self.rounds = out, rounds

    def say(self, text: str) -> None:
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {text}"
        with open(self.out / "server.log", "a") as log:
            log.write(line + "\n")
        print(line, flush=True)

    def start(self, label: str, rounds: int, done: int) -> None:
        self.say(f"run of {self.rounds} rounds, " + (f"resuming after round {done}" if done else "from the start"))

    def round(self, label: str, rec: dict, st, shown: dict) -> None:
        """The round's line, and history.csv so far."""
        sampled = str(rec.get("sampled", "")).split()
        self.say(f"round {rec['round']}/{self.rounds}: sampled {len(sampled)} ({' '.join(sampled)}), answered "
                 f"{rec['clients']}, failed: {rec.get('failed') or 'none'}, dropped: {rec.get('dropped') or 'none'}, "
                 f"val_loss {rec['val_loss']:.6g}, {rec['round_s']:.1f} s")
        write_atomic(self.out / "history.csv", lambda path: write_history(path, st.history))

    def stop(self) -> None:
        pass

    def end(self, status: str, reason: str = "") -> None:
        """The run's outcome, in the log and in OUT/status.json (what `fedl2p flower run` exits by)."""
        self.say(f"run {status}" + (f": {reason}" if reason else ""))
        write_atomic(self.out / "status.json", lambda path: path.write_text(
            json.dumps({"status": status, "reason": reason}) + "\n"))


def write_atomic(path: Path, write) -> None:
    """`write(tmp)` then one os.replace: a reader (or a kill) sees the old file or the new one, never half of one."""
    tmp = path.with_name(path.name + ".part")
    write(tmp)
    os.replace(tmp, path)


@dataclasses.dataclass(frozen=True)
class Site:
    """A SuperNode's answer to `query`: which site it says it is."""
    node: int
    client: int
    name: str


def sites_of(replies) -> list[Site]:
    out = []
    for r in replies:
        if r.has_error():
            raise FedL2PError(f"a SuperNode could not say which site it is: {r.error.reason}")
        site = r.content.config_records["site"]
        out.append(Site(r.metadata.src_node_id, int(site["client"]), str(site["name"])))
    return out


def federation(found: list[Site], sites: int, allowed: list[str] | None, say) -> list[Site]:
    """The run's sites among the SuperNodes that answered: a closed list. With the run config's site names, a node
    naming another site is not sampled (and named through `say`); without them, more nodes than `sites` is refused
    (which ones are the federation's cannot be told). Two nodes claiming one site (by name or by client id) cannot
    be told apart either: one line naming both."""
    if allowed is not None:
        for s in found:
            if s.name not in allowed:
                say(f"SuperNode {s.node} (site '{s.name}', client {s.client}) is not one of the run's sites "
                    f"({', '.join(allowed)}): not sampled")
        found = [s for s in found if s.name in allowed]
    for i, a in enumerate(found):
        for b in found[i + 1:]:
            if a.name == b.name or a.client == b.client:
                raise FedL2PError(f"two SuperNodes claim one site: node {a.node} (site '{a.name}', client {a.client}) "
                                  f"and node {b.node} (site '{b.name}', client {b.client}); unregister the one that "
                                  "is not the site's (flwr supernode unregister)")
    if allowed is None and len(found) > sites:
        raise FedL2PError(f"{len(found)} SuperNodes are connected and the run config has {sites} sites ("
                          f"{', '.join(f'{s.name} (node {s.node})' for s in found)}): name the run's sites with "
                          "`fedl2p flower run-config --site-names`")
    return found


def site_names(found: list[Site]) -> tuple[dict[int, int], dict[int, str]]:
    """Node id and site name by client id."""
    return {s.client: s.node for s in found}, {s.client: s.name for s in found}


def join(grid, rc, say, Message, RecordDict, timeout: float = 120.0) -> list[Site]:
    """Wait until the run's sites have connected (all of `site-names`, or `sites` nodes), asking each new node once
    which site it is."""
    sites, allowed = int(rc["sites"]), json.loads(str(rc["site-names"])) if rc.get("site-names") else None
    end, known = time.monotonic() + timeout, {}
    while True:
        new = [n for n in wait_nodes(grid, sites, max(end - time.monotonic(), 0.0)) if n not in known]
        if new:
            for s in sites_of(grid.send_and_receive(
                    [Message(RecordDict(), dst_node_id=n, message_type="query") for n in new])):
                known[s.node] = s
        found = federation(list(known.values()), sites, allowed, lambda text: None)
        if len(found) >= sites:
            return federation(list(known.values()), sites, allowed, say)
        if time.monotonic() > end:
            missing = sorted(set(allowed or []) - {s.name for s in found})
            raise FedL2PError(f"only {len(found)} of the run's {sites} sites connected within {timeout:.0f} s"
                              + (f" (missing: {', '.join(missing)})" if missing else ""))
        time.sleep(0.5)


def _server_app():
    from flwr.app import Message, RecordDict
    from flwr.serverapp import ServerApp
    app = ServerApp()

    @app.main()
    def main(grid, context):
        rc = context.run_config
        cfg = config_from_dict(json.loads(str(rc["meta-train"])))
        out = Path(str(rc["out"]))
        out.mkdir(parents=True, exist_ok=True)
        log = ServerLog(out, cfg.rounds)
        try:
            serve(grid, rc, cfg, log, Message, RecordDict)
        except FedL2PError as e:  # a round failed the policy, too few sites came: the run fails, with its reason
            log.end("failed", str(e))
            raise
        log.end("completed")

    return app


def serve(grid, rc, cfg: MetaTrainConfig, log: ServerLog, Message, RecordDict) -> None:
    """The federation's rounds: wait for the sites, learn who they are, run the round loop, write lambda. The
    failure policy is the run config's runtime (each site receives it whole and computes on its own device)."""
    catalog = plugins.current()  # the ServerApp's (its entry point), handed to everything below it
    runtime = run_config_runtime(rc).replace(catalog=catalog)
    spec = json.loads(str(rc["model"]))
    theta = weights.load(Path(str(rc["model-file"])))
    out = Path(str(rc["out"]))
    node_of, names = site_names(join(grid, rc, log.say, Message, RecordDict))
    # the federation the loop serves: no model or statistics (the sites have them), the sites in place of a partition
    entries = mt.Entries.of(cfg, catalog)
    sites = _Sites(cfg, entries.server_step, entries.aggregator, tuple(sorted(node_of)))
    lam0 = initial_lambda(cfg, entries.head, spec["n_bn"], spec["n_x"], len(spec["params"]))
    cfg_dict = dataclasses.asdict(cfg)

    def execute(tasks: list[Any]) -> list:  # the strategy's MetaTasks
        return exchange(grid, [[spec, theta, t.lam, t.round, cfg_dict, runtime.to_dict()] for t in tasks],
                        [node_of[t.client] for t in tasks], plugin_roots(catalog), runtime.timeout())

    strategy = MetaStrategy(sites, lam0)
    strategy.names = names
    ckpt = Checkpoint(server_checkpoint(out, rc))  # a ServerApp killed mid-run resumes here on the next `flwr run`
    st = run_rounds(strategy, cfg.rounds, ckpt, log, execute, runtime.policy())
    weights.save(out / "lambda.safetensors", kept_lambda(cfg, st), {"variant": cfg.variant()})
    write_atomic(out / "history.csv", lambda path: write_history(path, st.history))


def run_config_runtime(rc) -> Runtime:
    """The runtime a run config carries (one written before the runtime had its own entry carried the failure policy
    in its meta-train settings)."""
    sent = json.loads(str(rc["runtime"])) if "runtime" in rc else {}
    return Runtime.from_dict(sent or json.loads(str(rc["meta-train"])))


if importlib.util.find_spec("flwr") is not None:  # the apps exist where the flower extra is installed
    server_app = _server_app()  # separate assignments: `flwr run` finds components by reading this file's AST
    client_app = build_client_app()
