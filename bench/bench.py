"""`make bench`: the numbers we steer by, as ratios measured in one run (robust on a noisy machine).

Each measurement runs in its own subprocess so that its peak RSS is its own. Results go to
bench/results.json and a table is printed.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from fedl2p_cli import plugins
from fedl2p_cli.cli import options
from fedl2p_cli.runtime import Runtime

HERE = Path(__file__).resolve().parent


def handed(**fields) -> Runtime:
    """A Runtime carrying this process's catalog: what this script, its own entry point, hands the runs it starts."""
    return Runtime(catalog=plugins.current(), **fields)

torch.set_num_threads(max(1, os.cpu_count() or 1))


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timeit(fn, reps: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


# -- measurements -----------------------------------------------------------------------------

def plain_model(m: torch.nn.Module) -> torch.nn.Module:
    """A copy of `m` as ordinary torch modules (nn.Conv2d and nn.MaxPool2d instead of core.conv's Conv2d and
    core.pool's MaxPool2d; MixBN with no policy active runs F.batch_norm exactly as nn.BatchNorm2d does): the
    plain-PyTorch reference, in training mode."""
    import copy

    from fedl2p_cli.core.conv import Conv2d
    from fedl2p_cli.core.pool import MaxPool2d
    plain = copy.deepcopy(m).train()
    native = {Conv2d: torch.nn.Conv2d, MaxPool2d: torch.nn.MaxPool2d}
    for mod in plain.modules():
        if type(mod) in native:
            mod.__class__ = native[type(mod)]
    return plain


def bench_partition() -> dict:
    from fedl2p_cli.stages import partition
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        art, _ = options.execute(partition, partition.PartitionConfig(dataset="fmnist", alpha=0.1, clients=1000,
                                                                      samples_per_client=60, unseen_fraction=0.1),
                                 {}, Path(d), handed(), False, plot=False)
        secs = time.perf_counter() - t
        size = sum(p.stat().st_size for p in art.path.iterdir()) / 2**20
    return {"partition_1000_clients_s": secs, "partition_file_mb": size, "peak_rss_mb": peak_rss_mb()}


def _embedded(d: str, clients: int = 70):
    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.stages import partition
    store = Store(d)
    art, _ = options.execute(partition, partition.PartitionConfig(dataset="fmnist-c", alpha=0.5, clients=clients), {},
                             store.root, handed(), False, plot=False)
    return store, art, partition.load(store, art.id)[1]


def bench_engine() -> dict:
    from fedl2p_cli.engine.progress import NoProgress
    from fedl2p_cli.stages import pretrain
    with tempfile.TemporaryDirectory() as d:
        _, _, part = _embedded(d)
        cfg = pretrain.PretrainConfig(rounds=6, fraction=0.2, eval_every=1000)
        _, hist = pretrain.train(cfg, part, None, NoProgress(), runtime=handed())
    rows = hist[1:]  # the first round pays one-off costs
    evals = sum(h.get("eval_s", 0.0) for h in rows)  # the scheduled evaluation is reported apart, not as overhead
    round_s = sum(h["round_s"] for h in rows) - evals
    client_s = sum(h["clients_s"] for h in rows)
    return {"pretrain_round_s": round_s / len(rows), "engine_overhead_fraction": (round_s - client_s) / round_s,
            "eval_s": evals, "peak_rss_mb": peak_rss_mb()}


def bench_stats() -> dict:
    from fedl2p_cli import plugins
    from fedl2p_cli.core.stats import many_client_stats
    from fedl2p_cli.models import registry
    with tempfile.TemporaryDirectory() as d:
        _, _, part = _embedded(d)
        xs = [part.client(c).train[0] for c in range(20)]
    model = registry.build("small-cnn", 1, 10, catalog=plugins.current()).eval()
    plain_eval = plain_model(model).eval()
    allx = torch.cat(xs)

    @torch.no_grad()
    def plain():  # the same samples, plain eval-mode forward at the same batch size
        for i in range(0, len(allx), 512):
            plain_eval(allx[i:i + 512])

    t_plain = timeit(plain, 5)
    t_stats = timeit(lambda: many_client_stats(model, xs), 5)
    return {"stats_throughput_vs_forward": t_plain / t_stats, "peak_rss_mb": peak_rss_mb()}


def _hyper_setup(name: str):
    from fedl2p_cli import plugins
    from fedl2p_cli.core.bn import bn_layers
    from fedl2p_cli.core.finetune import ClientBN, Strategy
    from fedl2p_cli.core.metanets import hyperparameters, init_lambda
    from fedl2p_cli.core.stats import stat_layers
    from fedl2p_cli.models import registry
    ch = 1 if name == "small-cnn" else 3
    m = registry.build(name, ch, 10, catalog=plugins.current())
    theta = {n: p.detach().clone() for n, p in m.named_parameters()}
    n_bn, n_x, n_p = len(bn_layers(m)), 2 * len(stat_layers(m)), len(theta)
    lam = init_lambda(n_bn, n_x, n_p, 1e-3, "both", 0)
    xi, xs = torch.rand(n_bn), torch.randn(n_x)
    hyper = lambda l: hyperparameters(l, xi, xs, n_p, 1e-3, 1.0)  # noqa: E731
    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(32, ch, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g))
    bn = ClientBN([b.running_mean.clone() for _, b in bn_layers(m)], [b.running_var.clone() for _, b in bn_layers(m)])
    beta, eta = (t.detach() for t in hyper(lam))
    return m, theta, lam, hyper, batch, bn, Strategy(beta, eta)


STABLE_IFT = "--meta-grad ift --hessian fo --ift-at star --q 3 --psi-power 3 --scale-by-psi --eta-grad last-step"


def default_meta_gradient(m, theta_prev, after, grad, lam, hyper, batch, bn):
    """`fedl2p meta-train --meta-grad ift`'s meta-gradient (STABLE_IFT, MetaConfig's IFT values) after the fine-tuning step
    theta_prev -> after with gradient `grad`, as `algorithms.fedl2p.meta_gradient` calls it."""
    from fedl2p_cli.configs import meta_of
    from fedl2p_cli.core.hypergrad import ift_hypergradient
    c = meta_of("fomaml", meta_grad="ift")
    assert (c.meta_grad, c.hessian, c.ift_at, c.q, c.psi_power, c.scale_by_psi, c.eta_grad) == \
        ("ift", "fo", "star", 3, 3, True, "last-step"), "STABLE_IFT no longer names the defaults"
    return lambda: ift_hypergradient(m, after, lam, hyper, batch, batch, bn, c.q, c.psi, c.scale_by_psi, c.hessian,
                                     c.psi_power, val_stats=c.val_stats, eta_step=list(grad))


def products(fn) -> dict:
    """First-order gradients and second-order (Hessian-vector, mixed) products of one call (bench/counting.py)."""
    from counting import count_backward
    with count_backward() as c:
        fn()
    return {"first_order": c.first_order, "second_order": c.second_order}


def bench_hypergrad(name: str) -> dict:
    """The stable IFT's meta-gradient (STABLE_IFT), the hypergradient (fo, exact; fo with --ift-at last-step, all at the
    paper's fixed psi) and FOMAML+ / one of *our* beta-mixed SGD steps, timed in turns (see `interleaved`: timing them
    one after the other let the machine's drift bias the ratios by up to 30% on ResNet-18); the default's and FOMAML+'s
    counts of backward passes; peak RSS after the first fo and after the first exact hypergradient."""
    from fedl2p_cli.core.finetune import ClientBN, sgd_step, step_with_grad
    from fedl2p_cli.core.hypergrad import fomaml_gradient, ift_hypergradient
    m, theta, lam, hyper, batch, bn, s = _hyper_setup(name)
    after, _, grad = step_with_grad(m, theta, *batch, s, ClientBN(list(bn.mean), list(bn.var)))
    fns = {"sgd": lambda: sgd_step(m, theta, *batch, s, ClientBN(list(bn.mean), list(bn.var))),
           "hypergrad_default": default_meta_gradient(m, theta, after, grad, lam, hyper, batch, bn),
           "hypergrad_fo": lambda: ift_hypergradient(m, theta, lam, hyper, batch, batch, bn, hessian="fo"),
           "hypergrad_exact": lambda: ift_hypergradient(m, theta, lam, hyper, batch, batch, bn, hessian="exact"),
           "hypergrad_fo_laststep": lambda: ift_hypergradient(m, after, lam, hyper, batch, batch, bn, hessian="fo",
                                                              theta_train=theta, inner_grad=grad),
           "fomaml": lambda: fomaml_gradient(m, theta, lam, hyper, batch, batch, bn)}
    out = {}
    for hess in ("fo", "exact"):
        out[f"rss_before_{hess}_mb"] = peak_rss_mb()
        fns[f"hypergrad_{hess}"]()
        out[f"hypergrad_{hess}_peak_rss_mb"] = peak_rss_mb()
    out |= {"stable_ift": STABLE_IFT, "hypergrad_default_products": products(fns["hypergrad_default"]),
            "fomaml_products": products(fns["fomaml"])}
    t = interleaved(fns, 10 if name == "small-cnn" else 2)
    return out | {"sgd_step_s": t["sgd"], **{f"{k}_ratio": v / t["sgd"] for k, v in t.items() if k != "sgd"}}


def interleaved(fns: dict, reps: int) -> dict[str, float]:
    """Median seconds per call of each function, timed in turns (a, b, c, a, b, c, ...) so that a slow phase of a
    shared machine hits every function alike; one warm-up call each first."""
    import statistics
    for f in fns.values():
        f()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def bench_steps(name: str, threads: int) -> dict:
    """Issue 13's micro-benchmark: our client work / a plain PyTorch training step on the same model and batch.
    Plain step: the model as an ordinary nn.Module (no policy active, so every BN layer runs F.batch_norm exactly as
    nn.BatchNorm2d does), loss.backward() and torch.optim.SGD. Ours: one fine-tuning step (`core.finetune.sgd_step`)
    under BN C (beta 1), BN G (beta 0), BN I and a mixed beta 0.5; the hypergradient (fo, exact; fo with --ift-at
    last-step, which reuses the last fine-tuning step's gradient) and FOMAML+."""
    import torch.nn.functional as F

    from fedl2p_cli.core.finetune import ClientBN, Strategy, sgd_step, step_with_grad
    from fedl2p_cli.core.hypergrad import fomaml_gradient, ift_hypergradient
    torch.set_num_threads(threads)
    m, theta, lam, hyper, batch, bn, s = _hyper_setup(name)
    x, y = batch
    plain = plain_model(m)
    opt = torch.optim.SGD(plain.parameters(), lr=1e-3)

    def plain_step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(plain(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    nb = len(s.beta)
    after, _, grad = step_with_grad(m, theta, x, y, s, ClientBN(list(bn.mean), list(bn.var)))  # --ift-at last-step's inputs

    def ours(beta):
        st = Strategy(beta, s.lr)
        return lambda: sgd_step(m, theta, x, y, st, ClientBN(list(bn.mean), list(bn.var)))

    fns = {"plain": plain_step, "bnc": ours(torch.ones(nb)), "bng": ours(torch.zeros(nb)), "bni": ours(None),
           "mixed": ours(torch.full((nb,), 0.5)),
           "hyper_fo": lambda: ift_hypergradient(m, theta, lam, hyper, batch, batch, bn, hessian="fo"),
           "hyper_fo_laststep": lambda: ift_hypergradient(m, after, lam, hyper, batch, batch, bn, hessian="fo",
                                                          theta_train=theta, inner_grad=grad),
           "fomaml": lambda: fomaml_gradient(m, theta, lam, hyper, batch, batch, bn),
           # the same hypergradients through nn.Conv2d's own double backward: what core.conv saves, in one run
           "hyper_fo_native_conv": lambda: ift_hypergradient(plain, theta, lam, hyper, batch, batch, bn, hessian="fo"),
           "hyper_fo_laststep_native_conv": lambda: ift_hypergradient(plain, after, lam, hyper, batch, batch, bn,
                                                                      hessian="fo", theta_train=theta, inner_grad=grad)}
    if name == "small-cnn":  # third order: ~40x a step; on ResNet-18 that is minutes per sample on this CPU
        fns["hyper_exact"] = lambda: ift_hypergradient(m, theta, lam, hyper, batch, batch, bn, hessian="exact")
    t = interleaved(fns, 15 if name == "small-cnn" else 3)
    return {"plain_step_s": t["plain"], **{f"{k}_ratio": v / t["plain"] for k, v in t.items() if k != "plain"},
            "peak_rss_mb": peak_rss_mb()}


def bench_client_round() -> dict:
    """Issue 13's whole client round (small CNN, one embedded FMNIST-C client, batch 32, e = 5, K = 1, Q = 3, one
    thread): `client_update` as meta-training runs it (fine-tuning, the client's validation loss, PreciseBN
    statistics, one meta-gradient), timed in turns against plain PyTorch fine-tuning alone (an `nn.Module`,
    `torch.optim.SGD`, the same batches): the floor that any implementation's round sits above."""
    import torch.nn.functional as F

    from fedl2p_cli import plugins
    from fedl2p_cli.algorithms.fedl2p import client_update
    from fedl2p_cli.configs import meta_of
    from fedl2p_cli.core.bn import bn_layers
    from fedl2p_cli.core.finetune import ClientBN
    from fedl2p_cli.core.functional import shuffled_batches
    from fedl2p_cli.core.metanets import init_lambda
    from fedl2p_cli.core.stats import stat_layers
    from fedl2p_cli.models import registry
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        _, _, part = _embedded(d)
        data = part.client(0)
    m = registry.build("small-cnn", 1, 10, catalog=plugins.current())
    theta = {n: p.detach().clone() for n, p in m.named_parameters()}
    n_bn, n_x = len(bn_layers(m)), 2 * len(stat_layers(m))
    lam = init_lambda(n_bn, n_x, len(theta), 0.01, "both", 0)
    xi, xs = torch.rand(n_bn), torch.randn(n_x)
    bn0 = ClientBN([b.running_mean.clone() for _, b in bn_layers(m)], [b.running_var.clone() for _, b in bn_layers(m)])
    (xt, yt) = data.train
    plain = plain_model(m)
    opt = torch.optim.SGD(plain.parameters(), lr=0.01)

    def plain_finetune():
        gen = torch.Generator().manual_seed(0)
        for _ in range(5):
            for idx in shuffled_batches(len(yt), 32, gen):
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(plain(xt[idx]), yt[idx]).backward()
                opt.step()

    def ours(**kw):
        cfg = meta_of("fomaml", iterations=1, epochs=5, batch_size=32, base_lr=0.01, **kw)
        return lambda: client_update(m, theta, lam, xi, xs, bn0, data, cfg, torch.Generator().manual_seed(0))

    fns = {"plain_finetune": plain_finetune, "ift_fo": ours(meta_grad="ift"),
           "ift_fo_laststep": ours(meta_grad="ift", ift_at="last-step"),
           "fomaml": ours(meta_grad="fomaml")}
    counts = {f"{k}_products": products(fns[k]) for k in ("ift_fo", "fomaml")}
    t = interleaved(fns, 11)
    return {"train_samples": len(yt), "plain_finetune_s": t["plain_finetune"], "stable_ift": STABLE_IFT, **counts,
            **{f"{k}_round_s": v for k, v in t.items() if k != "plain_finetune"}, "peak_rss_mb": peak_rss_mb()}


def bench_meta_round() -> dict:
    from fedl2p_cli.configs import meta_of
    from fedl2p_cli.stages import meta_train, pretrain, stats
    from fedl2p_cli.stages.interface import Inputs, StageContext, run_stage
    with tempfile.TemporaryDirectory() as d:
        store, part_art, _ = _embedded(d)
        pre, _ = options.execute(pretrain, pretrain.PretrainConfig(rounds=2, fraction=0.1), {"partition": part_art.id},
                                 store.root, handed(), False, plot=False)
        st, _ = run_stage(stats, stats.StatsConfig(), Inputs.given({"partition": part_art.id, "pretrain": pre.id}),
                          StageContext(store, handed()))
        cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=3, fraction=0.1,
                                                meta=meta_of("fomaml", epochs=5, base_lr=0.01, meta_grad="ift"))
        art, _ = options.execute(meta_train, cfg, {"pretrain": pre.id, "stats": st.id}, store.root, handed(), False)
        import csv
        with open(art.file("history.csv")) as f:
            rows = list(csv.DictReader(f))[1:]
    keys = ("finetune_s", "hypergrad_s", "aggregate_s", "io_s")
    tot = sum(float(r["round_s"]) for r in rows)
    split = {k[:-2]: sum(float(r.get(k) or 0) for r in rows) / tot for k in keys}
    split["other"] = 1 - sum(split.values())
    return {"meta_round_s": tot / len(rows), "meta_round_split": split, "peak_rss_mb": peak_rss_mb()}


def bench_workers() -> dict:
    """Client updates per second in meta-training (small CNN, embedded data, e = 5, K = 3): one process at one
    thread (today's default), one process at two threads, --workers 2 (two processes of one thread) and, where the
    flower extra is installed, --engine flower (two ClientApps in Flower's simulation). Timed from the rounds' own
    wall clock (history round_s), so the workers' one-off start-up is reported apart."""
    import csv
    import importlib.util

    from fedl2p_cli.configs import meta_of
    from fedl2p_cli.stages import meta_train, pretrain, stats
    from fedl2p_cli.stages.interface import Inputs, StageContext, run_stage
    out = {}
    with tempfile.TemporaryDirectory() as d:
        store, part_art, _ = _embedded(d)
        pre, _ = options.execute(pretrain, pretrain.PretrainConfig(rounds=2, fraction=0.1), {"partition": part_art.id},
                                 store.root, handed(), False, plot=False)
        st, _ = run_stage(stats, stats.StatsConfig(), Inputs.given({"partition": part_art.id, "pretrain": pre.id}),
                          StageContext(store, handed()))
        runs = [("1 process, 1 thread", 1, 1, "local"), ("1 process, 2 threads", 1, 2, "local"),
                ("2 workers, 1 thread each", 2, 1, "local")]
        if importlib.util.find_spec("flwr") and importlib.util.find_spec("ray"):  # the flower extra's venv
            runs.append(("Flower simulation, 2 ClientApps", 2, 1, "flower"))
        for label, workers, threads, engine in runs:
            torch.set_num_threads(threads)
            cfg = meta_train.MetaTrainConfig.preset("fomaml", rounds=3, fraction=0.2, seed=len(out),
                                             meta=meta_of("fomaml", epochs=5, base_lr=0.01, meta_grad="ift"))
            t = time.perf_counter()
            art, _ = options.execute(meta_train, cfg, {"pretrain": pre.id, "stats": st.id}, store.root,
                                     handed(workers=workers, engine=engine), False)
            total = time.perf_counter() - t
            with open(art.file("history.csv")) as f:
                rows = list(csv.DictReader(f))
            rounds_s = sum(float(r["round_s"]) for r in rows)
            updates = sum(int(r["clients"]) for r in rows)
            # the engine's cost beyond the clients' own work, rounds 2.. (round 1 holds the workers' start-up):
            # round time / (the clients' own fine-tuning + hypergradient time / parallel slots) - 1
            later = rows[1:]
            own = sum(float(r["finetune_s"]) + float(r["hypergrad_s"]) for r in later) / (workers if workers > 1 else 1)
            overhead = sum(float(r["round_s"]) for r in later) / own - 1 if own > 0 else None
            out[label] = {"updates_per_s": updates / rounds_s, "startup_s": total - rounds_s, "overhead": overhead}
    base = out["1 process, 1 thread"]["updates_per_s"]
    return {"workers": out, "speedup": {k: v["updates_per_s"] / base for k, v in out.items()}}


def bench_stage_rss() -> dict:
    """Peak RSS of each stage of a small embedded pipeline, each in a fresh process."""
    out = {}
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, FEDL2P_STORE=d)
        steps = [("partition", ["partition", "--clients", "70"]), ("pretrain", ["pretrain", "--rounds", "3"]),
                 ("stats", ["stats"]), ("meta-train", ["meta-train", "--rounds", "2", "--epochs", "2"]),
                 ("personalize", ["personalize", "--seeds", "0", "--epochs", "1"])]
        for name, args in steps:
            code = ("import resource,sys; from fedl2p_cli.cli.main import app;\n"
                    f"sys.argv=['fedl2p']+{args!r}\ntry:\n    app(standalone_mode=False)\nfinally:\n"
                    "    print('RSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024)")
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
            line = [ln for ln in r.stdout.splitlines() if ln.startswith("RSS")]
            out[name] = float(line[-1].split()[1]) if line else None
    return {"stage_peak_rss_mb": out}


def bench_server_memory(n: int) -> dict:
    """Server memory with n clients, small CNN (Fashion-MNIST shapes), in a fresh process: pFedLA holds every
    client's model and one hypernetwork per client (O(N model + N^2 layers hidden)); FedL2P holds lambda and one
    round's client updates (10% of the clients). State = bytes of the tensors it keeps; peak = RSS growth over the
    process after imports and the model, through init and one server step (pFedLA: one client's mix and
    hypernetwork update; FedL2P: the weighted mean of the round's lambdas)."""
    from fedl2p_cli import plugins
    from fedl2p_cli.algorithms import pfedla
    from fedl2p_cli.core.aggregate import weighted_average
    from fedl2p_cli.core.functional import get_state
    from fedl2p_cli.core.layer_mix import hypernet_step
    from fedl2p_cli.core.metanets import init_lambda
    from fedl2p_cli.core.stats import client_stats
    from fedl2p_cli.models import registry
    model = registry.build("small-cnn", 1, 10, catalog=plugins.current())
    names = [k for k, _ in model.named_parameters()]
    st = client_stats(model, torch.randn(64, 1, 32, 32))
    base = peak_rss_mb()
    lams = [init_lambda(len(st.xi), len(st.x), len(names), 1e-3, "both", i) for i in range(max(1, n // 10))]
    lam = weighted_average(lams, [1.0] * len(lams))
    fedl2p_state = sum(v.numel() * v.element_size() for v in lam.values())
    fedl2p_peak = peak_rss_mb() - base
    del lams
    server = pfedla.init_server(list(range(n)), get_state(model), names, 100, 100, torch.Generator().manual_seed(0))
    bar, _ = pfedla.personalized(server, 0, 0)
    delta = {k: 0.01 * torch.randn_like(bar[k]) for k in names}
    server.hypernets[0] = hypernet_step(server.hypernets[0], server.stacked, 0, names, server.layers, delta, 5e-3)
    return {"clients": n, "pfedla_state_mb": server.nbytes() / 2**20, "pfedla_peak_rss_mb": peak_rss_mb() - base,
            "fedl2p_state_mb": fedl2p_state / 2**20, "fedl2p_peak_rss_mb": fedl2p_peak}


def bench_batched() -> dict:
    """The batched executor on the CPU, one thread (bench/batching.py): per-client seconds of one step (small CNN,
    ResNet-18-cifar) and of a whole small-CNN client round (e = 5, K = 1, FOMAML+ and IFT) at N clients per vmapped
    group; N = 1 is one client at a time."""
    import batching
    torch.set_num_threads(1)
    dev = torch.device("cpu")
    out = {"cpu": cpu_name(), "capability": torch.backends.cpu.get_cpu_capability()}
    out["small-cnn"] = {"step": batching.step_per_client("small-cnn", dev, (1, 2, 4, 8))}
    for mg in ("fomaml", "ift"):
        out["small-cnn"][f"{mg}_round"] = batching.round_per_client("small-cnn", dev, mg, (1, 4), 5, 1)
    out["resnet18-cifar"] = {"step": batching.step_per_client("resnet18-cifar", dev, (1, 4), reps=2)}  # rounds: minutes
    return out


def cpu_name() -> str:
    from fedl2p_cli.runtime import cpu_model
    return cpu_model()


MEASUREMENTS = {
    "partition": bench_partition, "engine": bench_engine, "stats": bench_stats,
    "hypergrad_small": lambda: bench_hypergrad("small-cnn"), "hypergrad_resnet18": lambda: bench_hypergrad("resnet18-cifar"),
    "meta_round": bench_meta_round, "client_round": bench_client_round, "stage_rss": bench_stage_rss, "workers": bench_workers,
    "batched": bench_batched,
    **{f"steps_{m}_t{n}": (lambda m=m, n=n: bench_steps(m, n)) for m in ("small-cnn", "resnet18-cifar") for n in (1, 2)},
    **{f"server_memory_{n}": (lambda n=n: bench_server_memory(n)) for n in (10, 100, 1000)},
}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        print("RESULT " + json.dumps(MEASUREMENTS[sys.argv[2]]()))
        return
    only = sys.argv[1:] or list(MEASUREMENTS)
    path = HERE / "results.json"
    results = json.loads(path.read_text()) if sys.argv[1:] and path.exists() else {}  # a partial run updates
    results["machine"] = {"cpus": os.cpu_count(), "torch": torch.__version__}
    for name in only:
        t = time.perf_counter()
        r = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True)
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
        results[name] = json.loads(line[-1][7:]) if line else {"error": r.stderr.strip().splitlines()[-1:]}
        print(f"{name}: {time.perf_counter() - t:.0f}s {json.dumps(results[name])}", flush=True)
    path.write_text(json.dumps(results, indent=2))
    show(results)


def show(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title="fedl2p bench (ratios measured in one run)", caption=f"stable IFT: fedl2p meta-train {STABLE_IFT}")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_column("goal", justify="right")

    def add(label, value, goal="", fmt="{:.3g}"):
        t.add_row(label, "n/a" if value is None else fmt.format(value), goal)

    g = lambda k, f: r.get(k, {}).get(f)  # noqa: E731
    add("partition 1000 FMNIST clients (s)", g("partition", "partition_1000_clients_s"), "seconds")
    add("  its peak RSS (MB)", g("partition", "peak_rss_mb"))
    add("engine overhead per pretraining round", g("engine", "engine_overhead_fraction"), "< 0.10", "{:.1%}")
    add("stats throughput / plain forward", g("stats", "stats_throughput_vs_forward"), ">= 0.8", "{:.2f}")
    for key, label in (("hypergrad_small", "small-cnn"), ("hypergrad_resnet18", "resnet18-cifar")):
        add(f"stable IFT meta-gradient / SGD step, {label}", g(key, "hypergrad_default_ratio"), "<= 12", "{:.1f}x")
        n = g(key, "hypergrad_default_products")
        add("  its second-order products (first-order gradients)", n and f"{n['second_order']} ({n['first_order']})", "4", "{}")
        add(f"hypergradient fo / SGD step, {label}", g(key, "hypergrad_fo_ratio"), "<= 12", "{:.1f}x")
        add(f"hypergradient fo, --ift-at last-step / SGD step, {label}", g(key, "hypergrad_fo_laststep_ratio"), "<= 8", "{:.1f}x")
        add(f"hypergradient exact / SGD step, {label}", g(key, "hypergrad_exact_ratio"), "", "{:.1f}x")
        add(f"FOMAML+ / SGD step, {label}", g(key, "fomaml_ratio"), "", "{:.1f}x")
        add(f"  peak RSS after exact, {label} (MB)", g(key, "hypergrad_exact_peak_rss_mb"))
    for key in [k for k in r if k.startswith("steps_")]:
        label = key[len("steps_"):].replace("_t", ", threads ")
        add(f"plain PyTorch SGD step, {label} (ms)", 1e3 * g(key, "plain_step_s") if g(key, "plain_step_s") else None)
        for part, goal in (("bnc", "<= 1.2"), ("mixed", "<= 1.2"), ("bng", ""), ("bni", ""), ("hyper_fo", "<= 8"),
                           ("hyper_fo_laststep", "<= 8"), ("hyper_fo_native_conv", ""), ("hyper_fo_laststep_native_conv", ""),
                           ("hyper_exact", ""), ("fomaml", "")):
            if g(key, f"{part}_ratio") is not None:
                add(f"  ours {part} / plain step", g(key, f"{part}_ratio"), goal, "{:.2f}x")
    cr = r.get("client_round") or {}
    if "plain_finetune_s" in cr:
        add(f"plain PyTorch fine-tuning, e=5 on {cr['train_samples']} samples (s)", cr["plain_finetune_s"], "", "{:.3f}")
        for k, label in (("ift_fo", "stable IFT"), ("ift_fo_laststep", "IFT fo, --ift-at last-step"), ("fomaml", "FOMAML+")):
            add(f"  whole client round, K=1, {label} (s)", cr[f"{k}_round_s"], "", "{:.3f}")
            add("    ÷ plain fine-tuning", cr[f"{k}_round_s"] / cr["plain_finetune_s"], "", "{:.2f}x")
    for k, v in (r.get("workers", {}).get("workers") or {}).items():
        add(f"meta-train client updates/s, {k}", v["updates_per_s"], "", "{:.2f}")
        add("  vs 1 process at 1 thread", r["workers"]["speedup"][k], ">= 1.6 (2 workers)" if k.startswith("2") else "", "{:.2f}x")
        add("  round time beyond the clients' own work (rounds 2-3)", v.get("overhead"), "", "{:.1%}")
    for key in [k for k in r if k.startswith("server_memory_")]:
        n = key.rsplit("_", 1)[1]
        add(f"server state, {n} clients: pFedLA / FedL2P (MB)", None if g(key, "pfedla_state_mb") is None else
            f"{g(key, 'pfedla_state_mb'):.1f} / {g(key, 'fedl2p_state_mb'):.2f}", "", "{}")
        add(f"  server peak RSS growth, {n} clients: pFedLA / FedL2P (MB)", None if g(key, "pfedla_peak_rss_mb") is None else
            f"{g(key, 'pfedla_peak_rss_mb'):.0f} / {g(key, 'fedl2p_peak_rss_mb'):.0f}", "", "{}")
    for name, rec in ((k, v) for k, v in (r.get("batched") or {}).items() if isinstance(v, dict)):
        for part, label in (("step", "one SGD step"), ("fomaml_round", "client round, FOMAML+"), ("ift_round", "client round, IFT")):
            if part not in rec:
                continue
            per = {int(n): v["per_client_s"] for n, v in rec[part].items()}
            add(f"batched {label}, {name}: per client at N = {'/'.join(map(str, per))} (ms)",
                " / ".join(f"{1e3 * t:.1f}" for t in per.values()), "", "{}")
    split = g("meta_round", "meta_round_split") or {}
    add("meta-train round (s)", g("meta_round", "meta_round_s"))
    for k, v in split.items():
        add(f"  share {k}", v, "", "{:.1%}")
    for k, v in (g("stage_rss", "stage_peak_rss_mb") or {}).items():
        add(f"peak RSS {k} (MB)", v)
    Console().print(t)


if __name__ == "__main__":
    main()
