"""The batched executor's speed (`--engine batched`): per-client cost of one fine-tuning step and of one whole client
round (FedL2P's `client_update`) at N clients per vmapped group, against one client at a time, on CIFAR-shaped
synthetic clients (3x32x32, 10 classes, batch 32, 36 train and 12 validation images). Used by `make bench` (the CPU,
small N) and `make bench-gpu` (N up to 128, with peak memory).
"""

from __future__ import annotations

import statistics
import time

import torch

SHAPE = dict(channels=3, size=32, classes=10, train=36, val=12, batch=32)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def clients(model_name: str, n: int, dev: torch.device):
    """A model on `dev`, its parameters, a lambda and `n` synthetic clients (data, statistics, BN statistics)."""
    from fedl2p_cli import device, plugins
    from fedl2p_cli.core.client import ClientData
    from fedl2p_cli.core.finetune import ClientBN
    from fedl2p_cli.core.metanets import init_lambda
    from fedl2p_cli.core.stats import client_stats
    from fedl2p_cli.models import registry
    m = registry.build(model_name, SHAPE["channels"], SHAPE["classes"], catalog=plugins.current()).to(dev).eval()
    theta = {k: v.detach().clone() for k, v in m.named_parameters()}
    out = []
    for c in range(n):
        g = torch.Generator().manual_seed(c)
        k = SHAPE["train"] + SHAPE["val"]
        x = torch.randn(k, SHAPE["channels"], SHAPE["size"], SHAPE["size"], generator=g).to(dev)
        y = torch.randint(0, SHAPE["classes"], (k,), generator=g).to(dev)
        tr = SHAPE["train"]
        data = ClientData((x[:tr], y[:tr]), (x[tr:], y[tr:]), (x[:0], y[:0]))
        st = client_stats(m, data.train[0])
        out.append((data, st, ClientBN(st.bn_mean, st.bn_var)))
    st = out[0][1]
    lam = device.move(init_lambda(len(st.xi), len(st.x), len(theta), 1e-3, "both", 0), dev)
    return m, theta, lam, out


def median_time(fn, dev: torch.device, reps: int) -> float:
    fn()
    sync(dev)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync(dev)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def step_per_client(model_name: str, dev: torch.device, ns: tuple[int, ...], reps: int = 5) -> dict:
    """Seconds per client of one beta-mixed SGD step (one epoch of one batch): N = 1 is `finetune` one client at a
    time, N > 1 `finetune_many` on N clients; peak device memory per N on a GPU."""
    from fedl2p_cli.core.batched import finetune_many
    from fedl2p_cli.core.finetune import Strategy, finetune
    m, theta, lam, cl = clients(model_name, max(ns), dev)
    s = Strategy(torch.full((len(cl[0][2].mean),), 0.5, device=dev), torch.full((len(theta),), 1e-3, device=dev))
    xs = [d.train[0][:SHAPE["batch"]] for d, _, _ in cl]
    ys = [d.train[1][:SHAPE["batch"]] for d, _, _ in cl]
    out: dict = {}
    for n in ns:
        gens = lambda n=n: [torch.Generator().manual_seed(c) for c in range(n)]  # noqa: E731
        if n == 1:
            fn = lambda gens=gens: finetune(m, theta, xs[0], ys[0], s, cl[0][2], 1, SHAPE["batch"], gens()[0], "running")  # noqa: E731
        else:
            fn = lambda n=n, gens=gens: finetune_many(m, [theta] * n, xs[:n], ys[:n], [s] * n, [c[2] for c in cl[:n]], 1,  # noqa: E731
                                                     SHAPE["batch"], gens(), "running")
        out[n] = _measured(fn, dev, reps, n)
    return out


def round_per_client(model_name: str, dev: torch.device, meta_grad: str, ns: tuple[int, ...], epochs: int,
                     iterations: int, reps: int = 3) -> dict:
    """Seconds per client of FedL2P's whole client round (e epochs, K iterations, PreciseBN, the validation loss and
    the meta-gradient): `client_update` one at a time (N = 1) against `client_update_many` on N clients."""
    from fedl2p_cli.algorithms.fedl2p import client_update, client_update_many
    from fedl2p_cli.configs import meta_of
    m, theta, lam, cl = clients(model_name, max(ns), dev)
    cfg = meta_of("fomaml", iterations=iterations, epochs=epochs, batch_size=SHAPE["batch"], meta_grad=meta_grad)
    out: dict = {}
    for n in ns:
        gens = lambda n=n: [torch.Generator().manual_seed(c) for c in range(n)]  # noqa: E731
        if n == 1:
            d, st, bn = cl[0]
            fn = lambda d=d, st=st, bn=bn, gens=gens: client_update(m, theta, lam, st.xi, st.x, bn, d, cfg, gens()[0])  # noqa: E731
        else:
            fn = lambda n=n, gens=gens: client_update_many(m, theta, [lam] * n, [(c[1].xi, c[1].x) for c in cl[:n]],  # noqa: E731
                                                          [c[2] for c in cl[:n]], [c[0] for c in cl[:n]], cfg, gens())
        out[n] = _measured(fn, dev, reps, n)
    return out


def _measured(fn, dev: torch.device, reps: int, n: int) -> dict:
    """Seconds per client; on a GPU the peak memory and, for one client (N = 1), the group size `--client-batch auto`
    plans from that footprint on this card (engine.batched.Groups measures the same: peak minus what was allocated)."""
    from fedl2p_cli.engine.batched import MAX_GROUP, auto_size
    if dev.type == "cuda":
        sync(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
    t = median_time(fn, dev, reps)
    rec: dict = {"per_client_s": t / n}
    if dev.type == "cuda":
        peak = torch.cuda.max_memory_allocated(dev)
        rec["peak_gpu_mb"] = peak / 2**20
        if n == 1:
            rec["auto_n"] = auto_size(dev, peak - base, MAX_GROUP)
    return rec
