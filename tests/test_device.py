"""Device hygiene on the CPU: every client update runs with torch's default device set to "meta" while its inputs are
CPU tensors, so a tensor created without following its inputs (a bare torch.zeros / arange / full / tensor) lands on
the meta device and the update fails. Plus the one place that decides the device, and what the manifest records."""

from dataclasses import dataclass, replace

import pytest
import torch

from fedl2p_cli import device, plugins
from fedl2p_cli.algorithms import cafeme, local, pfedla
from fedl2p_cli.algorithms.fedl2p import client_update
from fedl2p_cli.catalog import PRETRAIN_ALGO
from fedl2p_cli.core.client import ClientData
from fedl2p_cli.core.finetune import ClientBN, Strategy, finetune, personalized_accuracy, precise_bn
from fedl2p_cli.core.functional import evaluate, get_state
from fedl2p_cli.core.metanets import init_lambda
from fedl2p_cli.core.modulate import gate_sites, init_modulator
from fedl2p_cli.core.stats import client_stats
from fedl2p_cli.errors import FedL2PError
from fedl2p_cli.models.registry import build
from fedl2p_cli.runtime import Runtime

from .helpers import detached_params, handed, old_meta


def cpu_tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in cpu_tensors(v)]
    if hasattr(obj, "__dataclass_fields__"):
        return [t for k in obj.__dataclass_fields__ for t in cpu_tensors(getattr(obj, k))]
    return []


@pytest.fixture(scope="module")
def client():
    """A small CNN, its statistics and a client with train, validation and test data, all on the CPU."""
    torch.manual_seed(0)
    model = build("small-cnn", 1, 4, seed=0, catalog=plugins.current())
    x = torch.randn(40, 1, 16, 16)
    y = torch.randint(0, 4, (40,))
    data = ClientData((x[:24], y[:24]), (x[24:32], y[24:32]), (x[32:], y[32:]))
    st = client_stats(model.eval(), data.train[0])
    theta = detached_params(model)
    return model, theta, data, st


def on_meta(fn):
    """Run fn() with "meta" as torch's default device; every tensor it returns must be a CPU tensor."""
    with torch.device("meta"):
        out = fn()
    bad = [t.device for t in cpu_tensors(out) if t.device.type != "cpu"]
    assert not bad, f"tensors on {bad[0]}: created without following the inputs' device"
    return out


META = old_meta(epochs=1, batch_size=8, base_lr=0.01, meta_grad="ift")  # the second-order path
VARIANTS = {"ift-fo": META, "ift-exact": replace(META, hessian="exact"), "ift-last-step": replace(META, ift_at="last-step"),
            "fomaml": replace(META, meta_grad="fomaml"), "valtbs": replace(META, val_stats="test-batch"),
            "running-bn": replace(META, client_bn="running"), "eta-nonneg": replace(META, eta_nonneg=True),
            "sigmoid": replace(META, beta_output="sigmoid")}


@pytest.mark.parametrize("nets", ["both", "bnnet", "lrnet"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_meta_client_update_follows_its_inputs(client, variant, nets):
    if nets != "both" and variant != "ift-fo":
        pytest.skip("the nets ablations once, with the default meta-gradient")
    model, theta, data, st = client
    lam = init_lambda(len(st.xi), len(st.x), len(theta), 0.01, nets, 0)
    gen = torch.Generator().manual_seed(0)
    r = on_meta(lambda: client_update(model, theta, lam, st.xi, st.x, ClientBN(st.bn_mean, st.bn_var), data,
                                      VARIANTS[variant], gen))
    assert set(r.lam) == set(lam)


@pytest.mark.parametrize("method", ["bnc", "bng", "bni", "mixed", "mixed-chunked"])
def test_finetune_and_evaluation_follow_their_inputs(client, method):
    model, theta, data, st = client
    n_bn, n_p = len(st.xi), len(theta)
    beta = {"bnc": torch.ones(n_bn), "bng": torch.zeros(n_bn), "bni": None}.get(method, torch.full((n_bn,), 0.3))
    s = Strategy(beta, torch.full((n_p,), 0.01))
    gen = torch.Generator().manual_seed(1)

    def run():
        ft = finetune(model, theta, *data.train, s, ClientBN(st.bn_mean, st.bn_var), 2, 8, gen)
        bn = precise_bn(model, ft.params, data.train[0], beta, chunk=10) if method == "mixed-chunked" else ft.bn
        return ft.params, bn, personalized_accuracy(model, ft.params, *data.test, s, bn, 8), \
            evaluate(model, theta, *data.val), personalized_accuracy(model, ft.params, *data.test, s, bn, 8, "test-batch")

    on_meta(run)


def test_statistics_follow_their_inputs(client):
    model, _, data, _ = client
    on_meta(lambda: client_stats(model.eval(), data.train[0]))


@pytest.mark.parametrize("algo", ["fedavg", "fedbabu", "perfedavg-hf"])
def test_pretraining_updates_follow_their_inputs(client, algo):
    model, _, data, _ = client
    cfg = local.LocalConfig(epochs=1, batch_size=8, head="10.", freeze_head=algo == "fedbabu", pf_alpha=0.01)
    state = get_state(model)
    gen = torch.Generator().manual_seed(2)
    client = plugins.build().get(PRETRAIN_ALGO, algo).client
    on_meta(lambda: client(model, state, *data.train, 0.05, cfg, gen))
    model.load_state_dict(state)  # the module is a workspace: leave it as the other tests found it


@pytest.mark.parametrize("k", [0, 1])
def test_pfedla_round_follows_its_inputs(client, k):
    model, _, data, _ = client
    names = [n for n, _ in model.named_parameters()]
    server = pfedla.init_server([0, 1, 2], get_state(model), names, 8, 16, torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(4)
    on_meta(lambda: pfedla.client_round(model, server, 1, data, local.LocalConfig(epochs=1, batch_size=8), 0.05, 0.01, k, gen))
    on_meta(lambda: pfedla.personalized(server, 2, k))


@pytest.mark.parametrize("order", ["first", "second"])
def test_cafeme_update_and_personalisation_follow_their_inputs(client, order):
    model, _, data, _ = client
    sites = gate_sites(model, 1)
    mu = init_modulator(1, 4, sum(c for _, c in sites), torch.Generator().manual_seed(5))
    omega = cafeme.join(mu, {n: p.detach().clone() for n, p in model.named_parameters()})
    cfg = cafeme.CAFeMeConfig(steps=2, inner_lr=0.05, outer_lr=1e-3, batch_size=8, order=order, outer="adam",
                              num_classes=4)
    gen = torch.Generator().manual_seed(6)
    on_meta(lambda: cafeme.client_update(model, sites, omega, data.train, data.val, cfg, gen))
    on_meta(lambda: cafeme.personalize_and_test(model, sites, omega, data.train, data.test, 2, cfg, gen))


def test_the_check_catches_a_tensor_made_on_the_default_device(client):
    """The harness itself: a bare factory call inside the update is caught."""
    _, theta, _, _ = client
    with pytest.raises((RuntimeError, NotImplementedError, AssertionError)):
        on_meta(lambda: {k: v + torch.zeros(v.shape) for k, v in theta.items()})


def test_the_device_option_is_decided_in_one_place():
    assert device.resolve("cpu") == torch.device("cpu")
    assert device.resolve("auto") == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
    for bad in ("tpu", "cuda:x", "mps"):
        with pytest.raises(FedL2PError, match="--device"):
            device.resolve(bad)
    if not torch.cuda.is_available():
        with pytest.raises(FedL2PError, match="no CUDA device"):
            device.resolve("cuda")
    assert Runtime().torch_device == torch.device("cpu")  # the library's default: results as before


def test_move_returns_cpu_tensors_themselves_and_walks_containers():
    t = torch.ones(2)
    bn = ClientBN([t], [t])
    assert device.move(t, "cpu") is t and device.move({"a": [t, (t,)]}, "cpu")["a"][1][0] is t
    assert device.move(bn, "cpu").mean[0] is t and device.move(None, "cpu") is None


def test_manifest_records_where_an_artifact_was_computed(tiny_store):
    on = tiny_store["meta"].manifest["computed_on"]
    assert on["device"] == "cpu" and on["torch"] == torch.__version__ and on["deterministic"] is False
    # the CPU and the instruction set torch dispatches to: another CPU may give other bits under the same id
    assert on["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and on["cpu"] and on["threads"] >= 1
    assert "computed_on" not in tiny_store["meta"].config  # not part of the id


def test_gpus_per_client_is_refused_where_it_means_nothing():
    from fedl2p_cli.stages.meta_train import check_runtime
    with pytest.raises(FedL2PError, match="--gpus-per-client"):
        check_runtime(handed(engine="local", gpus_per_client=0.5))
    check_runtime(handed(engine="flower"))  # on the CPU, Flower needs no GPU share


class _Root:
    """What a command's Typer context answers: the global options as parsed (--device, --deterministic, --threads)."""

    def __init__(self, **params):
        self.params = params

    def find_root(self):
        return self


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows the key applying by its refusal of cuda on a CPU machine")
def test_a_pipeline_files_device_applies_unless_the_user_chose_one():
    from fedl2p_cli.cli.options import runtime
    threads = torch.get_num_threads()
    try:
        # --device cpu (or FEDL2P_DEVICE=cpu) wins over the file's device
        assert runtime(_Root(device="cpu", threads=threads), device="cuda").device == "cpu"
        with pytest.raises(FedL2PError, match="no CUDA device"):  # no --device given: the file's applies
            runtime(_Root(device=None, threads=threads), device="cuda")
    finally:
        torch.set_num_threads(threads)


def test_worker_processes_receive_the_runtime_whole():
    """What a worker process or ClientApp is sent is a plain dict (no pickle), from which it rebuilds the same
    Runtime, applies it and builds its context with it."""
    import json

    from fedl2p_cli.engine.workers import on_runtime
    rt = Runtime(workers=2, engine="local", min_answers=0.5, round_retries=2, plugins=("fedl2p_cli.builtin",))  # loaded already
    sent = json.loads(json.dumps(rt.to_dict()))  # JSON-safe, as a Flower message or a run config carries it
    threads = torch.get_num_threads()
    try:
        placed = on_runtime(sent, lambda *a: (a[:-1], a[-1]), "store", "id")
    finally:
        torch.set_num_threads(threads)
    args, got = placed.context
    assert args == ("store", "id") and got == rt and got.policy() == rt.policy() and placed.dev == rt.torch_device


def test_runtime_options_never_enter_an_artifact_id():
    """Declared once, as Runtime fields: no stage config holds one, so no id can include one."""
    import dataclasses

    from fedl2p_cli import configs
    from fedl2p_cli.core.config import flat_fields
    runtime_names = {f.name for f in dataclasses.fields(Runtime)}
    for cls in (configs.PartitionConfig, configs.PretrainConfig, configs.StatsConfig, configs.MetaTrainConfig,
                configs.PFLConfig, configs.PersonalizeConfig, configs.BetaGridConfig, configs.DecomposeConfig):
        assert not runtime_names & {f.name for f in flat_fields(cls)}, cls.__name__


# --- the executors own the device: a stand-in device ("meta") shows where each executor puts a task's tensors ---

META_DEV = torch.device("meta")


@dataclass
class ToyContext:
    model: torch.nn.Module
    theta: dict
    part: object


@dataclass
class ToyTask:
    client: int
    state: dict
    x: torch.Tensor


def toy_context() -> ToyContext:
    """A context as a stage builds it, on the CPU: a module, a dict of tensors and a partition of two clients."""
    import numpy as np

    from fedl2p_cli.io.partition_h5 import Partition
    images = torch.arange(8 * 16, dtype=torch.uint8).reshape(8, 1, 4, 4)
    offsets = np.array([[0, 2, 3, 4], [4, 6, 7, 8]])
    part = Partition("toy", images, torch.arange(8) % 2, torch.arange(8), offsets, np.zeros(2, int), np.zeros(2, bool),
                     np.ones((2, 2), int), ["a", "b"], ["d"], (0.5,), (0.25,))
    return ToyContext(torch.nn.Linear(2, 2), {"w": torch.ones(2)}, part)


def where(ctx: ToyContext, task: ToyTask) -> dict:
    """Where the update finds each input (device types only: no tensor to bring back from the stand-in device)."""
    return {"model": next(ctx.model.parameters()).device.type, "theta": ctx.theta["w"].device.type,
            "client": ctx.part.client(task.client).train[0].device.type, "state": task.state["w"].device.type,
            "x": task.x.device.type, "state_id": id(task.state)}


def toy_tasks() -> list[ToyTask]:
    state = {"w": torch.zeros(2)}  # the round's broadcast state: one dict that every task of the round shares
    return [ToyTask(c, state, torch.ones(3)) for c in (0, 1)]


def test_in_process_executor_puts_context_and_tasks_on_the_runtimes_device():
    from fedl2p_cli.engine.placement import OnDevice
    from fedl2p_cli.engine.rounds import in_process
    ctx = toy_context()
    out = in_process(where, OnDevice(ctx, META_DEV))(toy_tasks())
    assert all({k: v for k, v in r.items() if k != "state_id"} == dict.fromkeys(("model", "theta", "client", "state", "x"),
                                                                                "meta") for r in out)
    assert out[0]["state_id"] == out[1]["state_id"]  # the shared state moved once for the round, not once per client
    # the stage's own context stays where it was built
    assert next(ctx.model.parameters()).device.type == "cpu" and ctx.part.client(0).train[0].device.type == "cpu"


def test_a_result_comes_back_to_the_host_once(monkeypatch):
    from fedl2p_cli.engine import placement
    back = []
    monkeypatch.setattr(placement, "to_host", lambda r: back.append(r) or "host")
    on = placement.OnDevice(toy_context(), META_DEV)
    assert on(lambda ctx, task: task.x * 2, toy_tasks()[0]) == "host"
    assert len(back) == 1 and back[0].device.type == "meta"


@pytest.mark.parametrize("workers", [1, 2])
def test_the_worker_pool_puts_context_and_tasks_on_its_device(workers):
    """In this process (--workers 1) and in spawned worker processes, each of which builds and places its own context."""
    from fedl2p_cli.engine.workers import ClientPool
    with ClientPool(workers, toy_context, (), where, toy_context(), META_DEV) as pool:
        out = pool.map(toy_tasks())
    assert [{k: v for k, v in r.items() if k != "state_id"} for r in out] == \
        [dict.fromkeys(("model", "theta", "client", "state", "x"), "meta")] * 2


def test_the_flower_client_app_places_what_its_builder_gives(monkeypatch):
    """A ClientApp's context comes from `workers.on_runtime`, which places it on the runtime's device (resolved in
    that process); a context already placed is not placed again by a pool."""
    from fedl2p_cli.engine import placement, workers
    monkeypatch.setattr(Runtime, "resolved", lambda self: self)  # the stand-in device is no --device choice
    threads = torch.get_num_threads()
    placed = workers.on_runtime(Runtime(device="meta", plugins=("fedl2p_cli.builtin",)).to_dict(),
                                lambda rt: toy_context())
    try:
        assert placed.dev == META_DEV and placed(where, toy_tasks()[1])["client"] == "meta"
        assert placement.placed(placed, torch.device("cpu")) is placed
    finally:
        torch.set_num_threads(threads)


def test_the_engine_is_batched_by_default_on_a_gpu_and_says_so_in_one_line():
    """--engine auto (the default): batched on a GPU, local on the CPU; a command on a GPU says so in one line, and a
    user's choice stands. (The Runtime is not resolved here: its device string is enough, no GPU needed.)"""
    from fedl2p_cli.cli.options import auto_engine_line
    from fedl2p_cli.stages import meta_train
    assert Runtime().executor == "local" and Runtime(device="cuda:0").executor == "batched"
    assert Runtime(device="cuda:0", engine="local").executor == "local"
    assert auto_engine_line(Runtime(), True) is None and auto_engine_line(Runtime(device="cuda:0", engine="local"), True) is None
    line = auto_engine_line(Runtime(device="cuda:0"), True)
    assert line is not None and "\n" not in line and "--engine batched --client-batch auto" in line
    assert "--engine batched" not in (auto_engine_line(Runtime(device="cuda:0"), False) or "")
    meta_train.check(meta_train.MetaTrainConfig.preset("fomaml", local=True), handed(device="cuda:0"))  # --local runs no rounds
    # a pipeline file's workers (the quickstart's 2, for the CPU) leave the GPU's default batched; named, they conflict
    from fedl2p_cli.errors import FedL2PError
    meta_train.check(meta_train.MetaTrainConfig.preset("fomaml"), handed(device="cuda:0", workers=2))
    with pytest.raises(FedL2PError, match="leave --workers at 1"):
        meta_train.check(meta_train.MetaTrainConfig.preset("fomaml"), handed(device="cuda:0", engine="batched", workers=2))
    assert meta_train.check(meta_train.MetaTrainConfig.preset("fomaml"), handed(device="cuda:0", engine="local", workers=2)) is None
