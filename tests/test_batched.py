"""The batched executor computes, per client, what one client at a time computes (core.batched, engine.batched):
the step and fine-tuning with ragged clients, PreciseBN, FOMAML+'s meta-gradient, whole meta-train rounds, and the
retry at half the group when the device runs out of memory."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from fedl2p_cli.algorithms.fedl2p import Diverged, client_update, client_update_many
from fedl2p_cli.artifacts import Store
from fedl2p_cli.core.batched import finetune_many, fomaml_many, precise_bn_many
from fedl2p_cli.core.bn import bn_layers, index_bn_layers
from fedl2p_cli.core.client import ClientData
from fedl2p_cli.core.finetune import ClientBN, Strategy, finetune, precise_bn
from fedl2p_cli.core.hypergrad import fomaml_gradient
from fedl2p_cli.core.metanets import hyperparameters, init_lambda, init_log_lambda
from fedl2p_cli.engine.batched import BatchedPool, auto_size
from fedl2p_cli.engine.executors import Job
from fedl2p_cli.errors import FedL2PError
from fedl2p_cli.models import zoo
from fedl2p_cli.runtime import Runtime
from fedl2p_cli.stages import meta_train

from .conftest import TINY_META
from .helpers import execute

SIZES = (37, 64, 20)  # ragged: different numbers of batches, a short last batch, a client smaller than a batch


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = index_bn_layers(zoo.small_cnn(1, 10, width=4))
    for _, b in bn_layers(model):  # pretrained statistics that differ from any batch's
        b.running_mean.normal_(0, 0.1)
        b.running_var.uniform_(0.5, 1.5)
    theta = {k: v.detach() for k, v in model.named_parameters()}
    n_bn = len(bn_layers(model))
    xs = [torch.randn(n, 1, 12, 12) for n in SIZES]
    ys = [torch.randint(0, 10, (n,)) for n in SIZES]
    bns = [ClientBN([b.running_mean + 0.02 * i for _, b in bn_layers(model)],
                    [b.running_var * (1 + 0.1 * i) for _, b in bn_layers(model)]) for i in range(len(SIZES))]
    betas = [torch.tensor([0.0, 1.0, 0.3]), torch.rand(n_bn), torch.ones(n_bn)]  # BN G / BN C layers and mixed
    strategies = [Strategy(b, torch.full((len(theta),), 0.05 * (i + 1))) for i, b in enumerate(betas)]
    return model, theta, xs, ys, bns, strategies


def gens() -> list[torch.Generator]:
    return [torch.Generator().manual_seed(10 + i) for i in range(len(SIZES))]


def close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> bool:
    return bool((a - b).abs().max() <= tol * (1 + b.abs().max()))


@pytest.mark.parametrize("client_bn", ["precise", "running"])
def test_batched_fine_tuning_equals_one_client_at_a_time(setup, client_bn):
    """Ragged clients (3, 4 and 2 steps an epoch, 2 epochs): weights, the weights before the last step, the last
    batch and gradient, the BN statistics and the mean training loss, per client."""
    model, theta, xs, ys, bns, strategies = setup
    one = [finetune(model, theta, x, y, s, b, 2, 16, g, client_bn) for x, y, s, b, g in zip(xs, ys, strategies, bns, gens())]
    many = finetune_many(model, [theta] * 3, xs, ys, strategies, bns, 2, 16, gens(), client_bn)
    for a, b in zip(one, many):
        assert all(close(a.params[k], b.params[k]) for k in theta)
        assert all(close(a.prev_params[k], b.prev_params[k]) for k in theta)
        assert all(close(u, v) for u, v in zip(a.last_grad, b.last_grad))
        assert all(close(u, v) for u, v in zip(a.grad_sum, b.grad_sum))  # --lr-grad trajectory's path
        assert all(close(u, v) for u, v in zip(a.bn.mean + a.bn.var, b.bn.mean + b.bn.var))
        assert torch.equal(a.last_batch, b.last_batch)
        assert a.train_loss == pytest.approx(b.train_loss, rel=1e-5)


def test_batched_bn_i_fine_tuning_equals_one_client_at_a_time(setup):
    """beta None (BN I: batch statistics everywhere) in a group of its own."""
    model, theta, xs, ys, bns, strategies = setup
    bn_i = [Strategy(None, s.lr) for s in strategies]
    one = [finetune(model, theta, x, y, s, b, 1, 16, g) for x, y, s, b, g in zip(xs, ys, bn_i, bns, gens())]
    many = finetune_many(model, [theta] * 3, xs, ys, bn_i, bns, 1, 16, gens())
    for a, b in zip(one, many):
        assert all(close(a.params[k], b.params[k]) for k in theta)
    with pytest.raises(ValueError, match="cannot share a group"):
        finetune_many(model, [theta] * 2, xs[:2], ys[:2], [bn_i[0], strategies[1]], bns[:2], 1, 16, gens()[:2])


def test_batched_precise_bn_equals_one_client_at_a_time(setup):
    model, theta, xs, _, _, strategies = setup
    betas = [s.beta for s in strategies]
    many = precise_bn_many(model, [theta] * 3, xs, betas)
    for x, beta, b in zip(xs, betas, many):
        a = precise_bn(model, theta, x, beta)
        assert all(close(u, v) for u, v in zip(a.mean + a.var, b.mean + b.var))


@pytest.mark.parametrize("val_stats", ["running", "test-batch"])
@pytest.mark.parametrize("trajectory", [False, True], ids=["last-step", "trajectory"])
def test_batched_fomaml_gradient_equals_one_client_at_a_time(setup, val_stats, trajectory):
    """FOMAML+'s meta-gradient (a second-order graph through the last step) w.r.t. every meta-net tensor, with a
    short last batch and a short validation batch; with --lr-grad trajectory, the LRs' path along each client's own
    summed gradient."""
    model, theta, xs, ys, bns, _ = setup
    n_bn, n_p = len(bns[0].mean), len(theta)
    lams = [init_lambda(n_bn, 5, n_p, 0.01, "both", s, gain=1.0) for s in range(3)]
    inputs = [(torch.rand(n_bn), torch.rand(5)) for _ in range(3)]
    hyper = lambda lam, xi, x: hyperparameters(lam, xi, x, n_p, 0.01, 0.5)  # noqa: E731
    prev = [{k: v + 0.01 * torch.randn_like(v) for k, v in theta.items()} for _ in range(3)]
    last = [(x[:n], y[:n]) for x, y, n in zip(xs, ys, (16, 9, 16))]
    val = [(x[-n:], y[-n:]) for x, y, n in zip(xs, ys, (16, 16, 5))]
    dirs = [[torch.randn_like(v) for v in theta.values()] for _ in range(3)] if trajectory else None
    many = fomaml_many(model, hyper, lams, inputs, prev, last, val, bns, val_stats, eta_dirs=dirs)
    for c in range(3):
        one = fomaml_gradient(model, prev[c], lams[c], lambda lam, c=c: hyper(lam, *inputs[c]), last[c], val[c],
                              bns[c], val_stats, eta_step=dirs[c] if dirs else None)
        assert all(close(one.grads[k], many.grads[c][k], 1e-4) for k in lams[c])
        assert one.val_loss == pytest.approx(many.val_loss[c].item(), rel=1e-5)
        assert one.train_loss == pytest.approx(many.train_loss[c].item(), rel=1e-5)


def both_ways(setup, **settings):
    """FedL2P's client update for the ragged clients, one at a time and as one group: (lambda, results, results)."""
    model, theta, xs, ys, bns, _ = setup
    n_bn, n_p = len(bns[0].mean), len(theta)
    cfg = dataclasses.replace(TINY_META, batch_size=16, **settings)
    datas = [ClientData((x, y), (x[:12], y[:12]), (x[:4], y[:4])) for x, y in zip(xs, ys)]
    inputs = [(torch.rand(n_bn), torch.rand(5)) for _ in range(3)]
    lam = (init_log_lambda(n_bn, 5, n_p, cfg.base_lr, "both", 0) if cfg.head == "log"
           else init_lambda(n_bn, 5, n_p, cfg.base_lr, "both", 0, gain=1.0))
    one = [client_update(model, theta, lam, xi, x, b, d, cfg, g) for (xi, x), b, d, g in zip(inputs, bns, datas, gens())]
    return lam, one, client_update_many(model, theta, [lam] * 3, inputs, bns, datas, cfg, gens())


IFT_SETTINGS = [  # the defaults; the paper's literal Alg. 2 (exact Hessian, no psi bound, unscaled); the last-step reading
    {}, {"hessian": "exact", "psi_power": 0, "scale_by_psi": False, "eta_grad": "ift"},
    {"ift_at": "last-step", "val_stats": "test-batch"}, {"hessian": "exact", "ift_at": "last-step", "q": 2, "psi_power": 4}]


@pytest.mark.parametrize("settings", IFT_SETTINGS)
def test_batched_ift_meta_gradient_equals_one_client_at_a_time(setup, settings):
    """The IFT's meta-gradient (Hessian-vector products, Krylov basis, Neumann series, the psi bound, the LRs' last-step
    path) for a ragged group, one client update of K = 1 each: lambda after the step, the psi each client used."""
    lam, one, many = both_ways(setup, meta_grad="ift", iterations=1, **settings)
    for a, b in zip(one, many):
        assert all(close(a.lam[k], b.lam[k], 1e-4) for k in lam)
        assert a.report.get("psi") == pytest.approx(b.report.get("psi"), rel=1e-4)
        assert a.report["gnorm_bnnet"] == pytest.approx(b.report["gnorm_bnnet"], rel=1e-3)


LOG_HEAD = {"head": "log", "lr_grad": "trajectory"}  # the log head, its LRs' meta-gradient along the whole fine-tuning


@pytest.mark.parametrize("meta_grad", ["fomaml", "ift"])
@pytest.mark.parametrize("head", [{}, LOG_HEAD, LOG_HEAD | {"lr_grad": "trajectory-bn"}], ids=["paper", "log", "log-bn"])
def test_a_group_of_client_updates_equals_one_at_a_time(setup, meta_grad, head):
    """FedL2P's client update, K = 2 iterations, for a ragged group: lambda, the first validation loss, beta, eta."""
    lam, one, many = both_ways(setup, meta_grad=meta_grad, iterations=2, **head)
    for a, b in zip(one, many):
        assert all(close(a.lam[k], b.lam[k], 1e-4) for k in lam)
        assert a.val_loss == pytest.approx(b.val_loss, rel=1e-5) and a.n == b.n
        assert close(a.beta, b.beta) and close(a.eta, b.eta)


@dataclasses.dataclass(frozen=True)
class OnlyOne:
    """A plugin's meta-gradient with `one` alone (no `many`): FOMAML+ with its gradient doubled."""
    name: str = "only-one"
    about: str = "a test's meta-gradient"

    def one(self, *args):
        from fedl2p_cli.algorithms.meta_grads import Fomaml
        mg = Fomaml().one(*args)
        return dataclasses.replace(mg, grads={k: 2 * g for k, g in mg.grads.items()})


def test_a_meta_gradient_with_one_alone_runs_a_group_client_by_client(setup):
    """An entry needs only `one`: a group (the batched client update) runs it per client, with each client's inputs
    and generator, and gets what one client at a time gets; the doubled gradient is seen (not the built-in's)."""
    model, theta, xs, ys, bns, _ = setup
    n_bn, n_p = len(bns[0].mean), len(theta)
    cfg = dataclasses.replace(TINY_META, batch_size=16, meta_grad="fomaml", iterations=1)
    datas = [ClientData((x, y), (x[:12], y[:12]), (x[:4], y[:4])) for x, y in zip(xs, ys)]
    inputs = [(torch.rand(n_bn), torch.rand(5)) for _ in range(3)]
    lam = init_lambda(n_bn, 5, n_p, cfg.base_lr, "both", 0, gain=1.0)
    mine = OnlyOne()
    one = [client_update(model, theta, lam, xi, x, b, d, cfg, g, entry=mine)
           for (xi, x), b, d, g in zip(inputs, bns, datas, gens())]
    many = client_update_many(model, theta, [lam] * 3, inputs, bns, datas, cfg, gens(), entry=mine)
    plain = client_update_many(model, theta, [lam] * 3, inputs, bns, datas, cfg, gens())
    for a, b, c in zip(one, many, plain):
        assert all(close(a.lam[k], b.lam[k], 1e-4) for k in lam)
        assert not all(close(b.lam[k], c.lam[k], 1e-6) for k in lam)


@pytest.mark.parametrize("meta_grad", ["fomaml", "ift"])
def test_a_client_that_diverges_in_a_group_gets_what_it_gets_alone(setup, meta_grad):
    """A client whose fine-tuning turns non-finite (decided on the device, not read until the group
    ends): its `Diverged` says what one client at a time says, and the others' results are unchanged by it."""
    model, theta, xs, ys, bns, _ = setup
    n_bn, n_p = len(bns[0].mean), len(theta)
    cfg = dataclasses.replace(TINY_META, batch_size=16, meta_grad=meta_grad, iterations=2)
    xs = [x.clone() for x in xs]
    xs[1][3] = float("inf")  # in the training split only: the first validation loss stays finite
    datas = [ClientData((x[12:], y[12:]), (x[:12], y[:12]), (x[:4], y[:4])) for x, y in zip(xs, ys)]
    inputs = [(torch.rand(n_bn), torch.rand(5)) for _ in range(3)]
    lam = init_lambda(n_bn, 5, n_p, cfg.base_lr, "both", 0, gain=1.0)
    one: list = []
    for (xi, x), b, d, g in zip(inputs, bns, datas, gens()):
        try:
            one.append(client_update(model, theta, lam, xi, x, b, d, cfg, g))
        except Diverged as e:
            one.append(e)
    many = client_update_many(model, theta, [lam] * 3, inputs, bns, datas, cfg, gens())
    assert isinstance(one[1], Diverged) and isinstance(many[1], Diverged) and str(one[1]) == str(many[1])
    for a, b in ((one[0], many[0]), (one[2], many[2])):
        assert all(close(a.lam[k], b.lam[k], 1e-4) for k in lam)
        assert a.val_loss == pytest.approx(b.val_loss, rel=1e-5)


def test_batched_meta_train_rounds_write_the_same_artifact(tiny_store, tmp_path):
    """--engine batched --client-batch 2 (a round's 3 clients: a group of 2 and one of 1) writes the artifact one at a
    time writes: the same id, lambda equal to float tolerance, the same history apart from times."""
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5, seed=21, meta=TINY_META)
    arts = []
    for name, rt in (("one", Runtime()), ("many", Runtime(engine="batched", client_batch=2))):
        root = tmp_path / name
        shutil.copytree(tiny_store["store"].root, root)
        arts.append(execute(meta_train, cfg, Store(root),
                            {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id}, runtime=rt)[0])
    from fedl2p_cli.io import weights
    one, many = (weights.load(a.file("lambda.safetensors")) for a in arts)
    assert arts[0].id == arts[1].id
    assert all(close(one[k], many[k], 1e-4) for k in one)
    rows = [meta_train_history(a) for a in arts]
    assert [r["sampled"] for r in rows[0]] == [r["sampled"] for r in rows[1]]
    for a, b in zip(*rows):
        assert float(a["val_loss"]) == pytest.approx(float(b["val_loss"]), rel=1e-4)


def meta_train_history(art) -> list[dict]:
    import csv
    with open(art.file("history.csv")) as f:
        return list(csv.DictReader(f))


class _Ctx:
    def __init__(self, limit: int):
        self.limit, self.groups = limit, []


def _one(ctx: _Ctx, task: int) -> int:
    return task * task


def _many(ctx: _Ctx, tasks: list[int]) -> list[int]:
    ctx.groups.append(len(tasks))
    if len(tasks) > ctx.limit:  # what a GPU says when a group does not fit
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return [t * t for t in tasks]


def _job(ctx: _Ctx, size: int | str) -> Job:
    rt = Runtime(engine="batched", client_batch=size)
    return Job(rt, rt, lambda *a: ctx, (), _one, ctx, 10, _many)


def test_a_group_that_runs_out_of_memory_is_retried_at_half_its_size():
    """An injected out-of-memory error: the group of 8 is retried as 4, then 2; the round's results are complete,
    in task order, and the pool keeps the size that fitted."""
    ctx = _Ctx(limit=2)
    pool = BatchedPool(_job(ctx, 8), 8)
    assert pool.map(list(range(10))) == [t * t for t in range(10)]
    assert ctx.groups[:3] == [8, 4, 2] and set(ctx.groups[3:]) == {2} and pool.size == 2


def test_an_error_that_is_not_memory_propagates():
    ctx = _Ctx(limit=100)
    pool = BatchedPool(_job(ctx, 4), 4)
    pool.update_many = lambda c, ts: 1 / 0
    with pytest.raises(ZeroDivisionError):
        pool.map([1, 2])


def test_auto_group_size_is_one_on_the_cpu_and_memory_bound_elsewhere():
    ctx = _Ctx(limit=100)
    pool = BatchedPool(_job(ctx, "auto"), None)
    assert pool.map([1, 2, 3]) == [1, 4, 9] and pool.size == 1  # the CPU: one at a time measured faster
    assert auto_size(torch.device("cpu"), 10**9, 50) == 1


def test_client_batch_is_refused_by_the_engines_that_do_not_batch():
    from fedl2p_cli import plugins
    from fedl2p_cli.engine.executors import get
    catalog = plugins.build()
    with pytest.raises(FedL2PError, match="--client-batch is for --engine batched"):
        get("local", catalog).check(Runtime(client_batch=4))
    with pytest.raises(FedL2PError, match="leave --workers at 1"):
        get("batched", catalog).check(Runtime(engine="batched", workers=2))


def test_batched_personalisation_gives_the_same_results(tiny_store, tmp_path, monkeypatch):
    """personalize --client-batch 3 (every row's fine-tunings of 3 clients computed ahead in vmapped groups:
    hand-made, ft-tuned's candidates, FedL2P and its checked neighbours) gives the same accuracies, strategies and
    candidate scores as one client at a time, and the same artifact id; its scores are read once per group, and a
    prefetch takes only as many clients as fill a group."""
    import numpy as np

    from fedl2p_cli.stages import personalize
    cfg = personalize.PersonalizeConfig(epochs=1, batch_size=16, base_lr=0.01, seeds=[0, 1],
                                        methods=["ft-bnc", "ft-bni", "ft-tuned", "fedl2p", "fedl2p-checked"])
    from fedl2p_cli.stages import harness
    alone, one_at_a_time = [], harness.finetune
    monkeypatch.setattr(harness, "finetune", lambda *a, **k: alone.append(1) or one_at_a_time(*a, **k))
    scored_alone = []  # a score computed for one trial (its own host read), not with its group's

    def counted(fn):
        return lambda *a, **k: scored_alone.append(1) or fn(*a, **k)
    for name in ("personalized_accuracy", "evaluate"):
        monkeypatch.setattr(harness, name, counted(getattr(harness, name)))
    prefetched, prefetch = [], harness.Harness.prefetch  # (clients, fine-tunings) of each prefetch

    def recorded(self, wanted, groups, *a):
        prefetched.append((len({c.id for c, _, _ in wanted}), len(wanted)))
        return prefetch(self, wanted, groups, *a)
    monkeypatch.setattr(harness.Harness, "prefetch", recorded)
    out, counts, alone_scores = [], [], []
    for name, rt in (("one", Runtime()), ("many", Runtime(client_batch=3))):
        root = tmp_path / name
        shutil.copytree(tiny_store["store"].root, root)
        art, _ = execute(personalize, cfg, Store(root),
                         {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id, "meta": [tiny_store["meta"].id]},
                         force=True, runtime=rt)
        out.append((art, personalize.load(Store(root), art.id)[1]))
        counts.append(len(alone))
        alone_scores.append(len(scored_alone))
    (a1, one), (a2, many) = out
    assert counts[1] - counts[0] < counts[0] / 4  # batched: few fine-tunings ran alone (a group's leftover client)
    assert alone_scores[0] > 0 and alone_scores[1] == alone_scores[0]  # batched: every score read with its group's
    # a client's seeds and rows fill a group of 3 already: one client per prefetch, so what is held stays near a group
    assert prefetched and all(n == 1 and k >= 3 for n, k in prefetched), prefetched
    assert a1.id == a2.id and one.methods == many.methods
    assert np.allclose(one.acc_after, many.acc_after, atol=1e-6, equal_nan=True)
    assert all(np.allclose(one.beta[m], many.beta[m], equal_nan=True) for m in one.methods)
    assert np.allclose(one.candidates, many.candidates, rtol=1e-4, equal_nan=True)


def test_batched_scores_equal_one_client_at_a_time(setup):
    """A group's validation scores under the paper's inference (beta mixing each client's running statistics), two
    fine-tunings at a time in chunks of 8 samples across the ragged clients, two of them sharing a client's data: the
    summed loss and the correct answers of each."""
    from fedl2p_cli.core.batched import scores_many
    from fedl2p_cli.core.finetune import personalized_sums
    model, theta, xs, ys, bns, strategies = setup
    which = [0, 1, 2, 0, 2]  # two fine-tunings of clients 0 and 2 (one padded copy of their data each)
    params = [{k: v + 0.05 * torch.randn_like(v) for k, v in theta.items()} for _ in which]
    got = scores_many(model, params, [(xs[c], ys[c]) for c in which], [strategies[c].beta for c in which],
                      [bns[c] for c in which], samples=8, items=2)
    for i, c in enumerate(which):
        want = personalized_sums(model, params[i], xs[c], ys[c], strategies[c], bns[c], 16)
        assert close(got[i], want, 1e-6) and got[i, 1] == want[1]


def test_batched_per_fedavg_equals_one_client_at_a_time(setup):
    """Per-FedAvg (HF)'s local update for a ragged group (1, 2 and 1 steps of three batches; a client smaller than a
    batch): the weights, the running statistics the three forwards per step move, and the mean loss."""
    from fedl2p_cli.algorithms.local import perfedavg_client, perfedavg_clients
    from fedl2p_cli.core.client import LocalConfig
    from fedl2p_cli.core.functional import get_state
    model, _, xs, ys, _, _ = setup
    cfg = LocalConfig(epochs=1, batch_size=8, pf_alpha=0.05)
    sizes = (37, 64, 6)
    assert [max(1, n // 24) for n in sizes] == [1, 2, 1]
    xs, ys = [x[:n] for x, n in zip(xs, sizes)], [y[:n] for y, n in zip(ys, sizes)]
    state = get_state(model)
    lrs = [0.1, 0.05, 0.2]
    one = [perfedavg_client(model, state, x, y, lr, cfg, g) for x, y, lr, g in zip(xs, ys, lrs, gens())]
    many = perfedavg_clients(model, [state] * 3, xs, ys, lrs, cfg, gens())
    for (a, la), (b, lb) in zip(one, many):
        assert a.keys() == b.keys() and all(close(a[k].float(), b[k].float(), 1e-4) for k in a)
        assert la == pytest.approx(lb, rel=1e-5)
    assert not all(close(one[0][0][k], state[k], 1e-6) for k in state)  # the update moved the client


@pytest.mark.parametrize("algo", ["fedavg", "fedbabu", "perfedavg-hf"])
def test_batched_pretraining_writes_the_same_model(tiny_store, tmp_path, algo):
    """pretrain --engine batched --client-batch 2: FedAvg's, FedBABU's and Per-FedAvg's local updates for a round's
    clients as one vmapped group; the same id and, to float rounding, the same weights and running statistics as one
    at a time."""
    from fedl2p_cli.io import weights
    from fedl2p_cli.stages import pretrain

    from .conftest import TINY_PRETRAIN
    states = []
    for name, rt in (("one", Runtime()), ("many", Runtime(engine="batched", client_batch=2))):
        store = Store(tmp_path / name)
        shutil.copytree(tiny_store["store"].root / "partition", store.root / "partition")
        cfg = pretrain.PretrainConfig(**(TINY_PRETRAIN | {"algo": algo}))
        art, _ = execute(pretrain, cfg, store, {"partition": tiny_store["partition"].id}, plot=False, runtime=rt)
        states.append((art.id, weights.load(art.file("model.safetensors"))))
    (id1, one), (id2, many) = states
    assert id1 == id2 and one.keys() == many.keys()
    assert all(close(one[k].float(), many[k].float(), 1e-4) for k in one)


@pytest.mark.parametrize("meta_grad", ["fomaml", "ift"])
def test_the_batched_client_update_reads_the_device_a_fixed_number_of_times(meta_grad):
    """Host syncs (a tensor's value read into Python; on a GPU each waits for the device) per batched client update:
    a few per iteration for the whole group and one at the end, whatever the group's size (bench/host_syncs.py)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import host_syncs
    small, large = (sum(host_syncs.client_round(meta_grad, n).values()) for n in (2, 6))
    assert small == large == 1, (small, large)  # K = 2 iterations: none in them, one at the end for everything


def test_a_batched_personalisation_reads_the_device_once_per_set_of_clients():
    """personalize --client-batch 4 (bench/host_syncs.py --personalize): every fine-tuning's scores, each client's
    unadapted and global accuracies, read once per prefetched set of clients, and nothing else but the meta-nets'
    spread (two reads); a learned row and its x1 check share one prefetched fine-tuning, not computing it again."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import host_syncs
    counts, pairs = host_syncs.personalization(4)
    device = {site: k for site, k in counts.items() if not host_syncs._host_side(site)}
    # 7 clients x 2 seeds: a client's fine-tunings fill a group of 4, so each set is one client
    assert pairs == 14 and sum(device.values()) == 7 + 2, device


@pytest.mark.parametrize("algo", ["pfedla", "heurpfedla"])
def test_batched_pfedla_writes_the_same_server(tiny_store, tmp_path, algo):
    """pfl-train --engine batched --client-batch 2: pFedLA's and HeurpFedLA's clients' local SGD as one vmapped group
    (each client's hypernetwork step after it); the same id and, to float rounding, the same stored models and
    hypernetworks as one at a time."""
    from fedl2p_cli.io import weights
    from fedl2p_cli.stages import pfl
    out = []
    for name, rt in (("one", Runtime()), ("many", Runtime(engine="batched", client_batch=2))):
        store = Store(tmp_path / name)
        shutil.copytree(tiny_store["store"].root / "partition", store.root / "partition")
        cfg = pfl.PFLConfig(algo=algo, rounds=2, fraction=0.5, local_epochs=1, batch_size=16, lr=0.02, eval_every=1)
        art, _ = execute(pfl, cfg, store, {"partition": tiny_store["partition"].id}, runtime=rt)
        out.append((art.id, weights.load(art.file("server.safetensors"))))
    (id1, one), (id2, many) = out
    assert id1 == id2 and one.keys() == many.keys()
    assert all(close(one[k].float(), many[k].float(), 1e-4) for k in one)
