"""On a CUDA GPU (skipped without one): every stage end to end, the hypergradient against the float64 oracle, one
client update on CPU and GPU, and --deterministic repeating bit for bit. Run on a GPU machine:
`python -m pytest tests/test_cuda.py`."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from fedl2p_cli import device
from fedl2p_cli.algorithms.fedl2p import client_update
from fedl2p_cli.artifacts import Store
from fedl2p_cli.core.finetune import ClientBN
from fedl2p_cli.core.hypergrad import ift_hypergradient
from fedl2p_cli.io import weights
from fedl2p_cli.runtime import Runtime
from fedl2p_cli.stages import meta_train, partition, personalize, pfl, pretrain, stats

from .conftest import TINY_META, TINY_PARTITION, TINY_PRETRAIN
from .helpers import execute, old_meta, smooth_setup, tiny_client

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# float32 on a GPU against the CPU: different kernels and summation orders, so agreement is to rounding, not bits
CPU_GPU = dict(rtol=1e-3, atol=1e-4)


@pytest.fixture
def on_cuda():
    yield Runtime.create("cuda").apply(threads=torch.get_num_threads())
    torch.use_deterministic_algorithms(False)


def test_every_stage_end_to_end_on_cuda(tiny_store, on_cuda, tmp_path):
    store = Store(tmp_path)
    part, _ = execute(partition, partition.PartitionConfig(**TINY_PARTITION), store, plot=False)
    rt = on_cuda
    pres = {a: execute(pretrain, pretrain.PretrainConfig(algo=a, **TINY_PRETRAIN), store, {"partition": part.id}, plot=False, runtime=rt)[0]
            for a in ("fedavg", "fedbabu", "perfedavg-hf")}
    pre = pres["fedavg"]
    assert pre.id == tiny_store["pretrain"].id and pre.manifest["computed_on"]["device"] == "cuda:0"
    cpu_model = weights.load(tiny_store["pretrain"].file("model.safetensors"))
    gpu_model = weights.load(pre.file("model.safetensors"))
    for k, v in cpu_model.items():
        torch.testing.assert_close(gpu_model[k], v, rtol=1e-2, atol=1e-3)  # 3 rounds of SGD drift a little further
    st, _ = execute(stats, stats.StatsConfig(), store, {"partition": part.id, "pretrain": pre.id}, runtime=rt)
    metas = [execute(meta_train, meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5, meta=m), store,
                     {"pretrain": pre.id, "stats": st.id}, runtime=rt)[0]
             for m in (TINY_META, replace(TINY_META, hessian="exact"), replace(TINY_META, meta_grad="fomaml"),
                       replace(TINY_META, ift_at="last-step"))]
    metas.append(execute(meta_train, meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5, local=True, meta=TINY_META), store,
                         {"pretrain": pre.id, "stats": st.id}, runtime=rt)[0])
    assert all(m.metrics["diverged"] is None for m in metas)
    for algo in ("pfedla", "heurpfedla", "cafeme"):
        execute(pfl, pfl.PFLConfig(algo=algo, rounds=2, fraction=0.5, local_epochs=1, batch_size=16, lr=0.02, eval_every=1), store,
                {"partition": part.id}, runtime=rt)
    for unseen in (False, True):
        for eval_stats in ("running", "test-batch"):
            cfg = personalize.PersonalizeConfig(unseen=unseen, methods=["ft-bnc", "ft-bng", "ft-bni", "ft-tuned", "pfedla",
                                                                        "cafeme"], epochs=1, batch_size=16, base_lr=0.01,
                                                seeds=[0], pfl_steps=3, eval_stats=eval_stats)
            art, _ = execute(personalize, cfg, store,
                             {"pretrain": pre.id, "stats": st.id, "meta": [metas[0].id] if unseen else [m.id for m in metas]}, runtime=rt)
            _, r = personalize.load(store, art.id)
            assert np.isfinite(r.acc_after[[i for i, m in enumerate(r.methods) if m != "pfedla"]]).all()


def test_hypergradient_on_cuda_matches_the_float64_oracle_on_the_cpu():
    """Alg. 2 computed on the GPU in float64 against the dense oracle computed on the CPU (tests/test_hypergrad.py)."""
    from fedl2p_cli.core.metanets import hyperparameters
    from fedl2p_cli.core.stats import client_stats

    from .test_hypergrad import dense_pieces, flat, neumann_oracle
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    cuda = torch.device("cuda", 0)
    model, theta, lam, hyper, (x, y), bn = smooth_setup()
    try:
        tb, vb = (x[:12], y[:12]), (x[12:], y[12:])
        want = neumann_oracle(dense_pieces(model, theta, lam, hyper, tb, vb, bn))
        st = client_stats(model, x)  # the inputs smooth_setup's hyper reads, rebuilt on the GPU
        gxi, gxs = st.xi.double().to(cuda), st.x.double().to(cuda)
        n_p = len(theta)
        gtheta, glam, gtb, gvb = device.move((theta, lam, tb, vb), cuda)
        gbn = ClientBN(device.move(bn.mean, cuda), device.move(bn.var, cuda))
        got = ift_hypergradient(model.to(cuda), gtheta, glam, lambda l: hyperparameters(l, gxi, gxs, n_p, 0.05, 0.5),
                                gtb, gvb, gbn, hessian="exact")
        torch.testing.assert_close(flat(got.grads).cpu(), want, rtol=1e-7, atol=1e-10)
    finally:
        model.cpu()
        torch.set_default_dtype(old)


def _one_update(model, theta, lam, inputs, bn, data, dev):
    args = device.move((theta, lam, *inputs, bn, data), dev)
    model.to(dev)
    r = client_update(model, *args, old_meta(epochs=2, batch_size=16, base_lr=0.01, meta_grad="ift"), torch.Generator().manual_seed(0))
    model.cpu()
    return device.to_host(r)


def test_one_client_update_agrees_on_cpu_and_cuda_and_repeats_when_deterministic(tiny_store):
    model, theta, lam, inputs, bn, part, c = tiny_client(tiny_store)
    cpu = _one_update(model, theta, lam, inputs, bn, part.client(c), torch.device("cpu"))
    cuda = torch.device("cuda", 0)
    gpu = _one_update(model, theta, lam, inputs, bn, part.client_on(c, cuda), cuda)
    for k in lam:
        torch.testing.assert_close(gpu.lam[k], cpu.lam[k], **CPU_GPU)
    assert abs(gpu.val_loss - cpu.val_loss) < 1e-3
    try:
        Runtime.create("cuda", deterministic=True).apply(threads=torch.get_num_threads())
        a = _one_update(model, theta, lam, inputs, bn, part.client_on(c, cuda), cuda)
        b = _one_update(model, theta, lam, inputs, bn, part.client_on(c, cuda), cuda)
        assert all(torch.equal(a.lam[k], b.lam[k]) for k in lam) and a.val_loss == b.val_loss
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("workers", [1, 2])
def test_each_executor_puts_context_and_tasks_on_the_gpu_and_results_back_on_the_cpu(workers):
    """tests/test_device.py shows this on the `meta` stand-in; here on the GPU, results included."""
    from fedl2p_cli.engine.workers import ClientPool

    from .test_device import toy_context, toy_tasks, where

    def back(ctx, task):  # a tensor made on the device: the executor brings it back
        return where(ctx, task) | {"out": task.x * 2}

    with ClientPool(workers, toy_context, (), where if workers > 1 else back, toy_context(), torch.device("cuda", 0)) as pool:
        out = pool.map(toy_tasks())
    assert all(r["model"] == r["client"] == r["state"] == r["x"] == "cuda" for r in out)
    assert workers > 1 or all(r["out"].device.type == "cpu" for r in out)


@pytest.mark.parametrize("meta_grad", ["fomaml", "ift"])
def test_batched_meta_train_on_cuda_matches_one_client_at_a_time(tiny_store, on_cuda, tmp_path, meta_grad):
    """--engine batched on the GPU: the artifact of one client at a time on the GPU (same id), lambda to rounding;
    and the personalisation with --client-batch 4 gives the same accuracies."""
    import shutil
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5, seed=5, meta=replace(TINY_META, meta_grad=meta_grad))
    arts = []
    for name, rt in (("one", on_cuda.replace(client_batch=1)), ("many", on_cuda.replace(engine="batched", client_batch=4))):
        shutil.copytree(tiny_store["store"].root, tmp_path / name)
        store = Store(tmp_path / name)
        art, _ = execute(meta_train, cfg, store, {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id}, runtime=rt)
        pcfg = personalize.PersonalizeConfig(epochs=1, batch_size=16, base_lr=0.01, seeds=[0],
                                             methods=["ft-bnc", "ft-tuned", "fedl2p", "fedl2p-checked"])
        pers, _ = execute(personalize, pcfg, store,
                          {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id, "meta": [art.id]}, runtime=rt)
        arts.append((art, personalize.load(store, pers.id)[1]))
    (one, r1), (many, r2) = arts
    assert one.id == many.id
    a, b = weights.load(one.file("lambda.safetensors")), weights.load(many.file("lambda.safetensors"))
    assert all(torch.allclose(a[k], b[k], **CPU_GPU) for k in a)
    assert np.allclose(r1.acc_after, r2.acc_after, atol=0.02, equal_nan=True)


def test_a_pipeline_files_workers_leave_the_gpu_batched(tiny_store, on_cuda, tmp_path):
    """The quickstart's `workers = 2` (for the CPU) under --engine auto on a GPU: meta-training runs batched in this
    process, as the manifest says, with the id one client at a time gives."""
    import shutil
    shutil.copytree(tiny_store["store"].root, tmp_path / "s")
    cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=1, fraction=0.5, meta=TINY_META)
    art, _ = execute(meta_train, cfg, Store(tmp_path / "s"),
                     {"pretrain": tiny_store["pretrain"].id, "stats": tiny_store["stats"].id}, runtime=on_cuda.replace(workers=2))
    on = art.manifest["computed_on"]
    assert (on["engine"], on["workers"]) == ("batched", 1)
