"""`make bench-gpu`: FedL2P's client work on a CUDA GPU (skipped without one), written to bench/gpu.json.

On CIFAR-shaped synthetic data (3x32x32, 10 classes, batch 32), for ResNet-18-cifar and the small CNN:
- one plain PyTorch SGD step (nn.Module, torch.optim.SGD) and one of our beta-mixed steps (beta 0.5), their ratio;
- the `fo` IFT hypergradient and FOMAML+, each / our step;
- one whole client round of the CIFAR-10 pipeline's meta-training (36 train and 12 validation images, e = 15, K = 3,
  FOMAML+ and IFT): seconds and peak GPU memory;
- client updates per second with 1 to 8 processes sharing the GPU, each running `client_update` one client at a
  time (what `--engine local --workers N --device cuda` does: each process one CUDA context);
- the projected wall time of the shipped pipeline `cifar10-a0.1-fedavg` (500 pretraining rounds of 100 FedAvg clients,
  one at a time; 500 meta-train rounds of 100 clients at the best number of processes);
- the batched executor (`--engine batched`, bench/batching.py): per-client step and round at N = 1, 8, 32, 128 with
  peak memory, the group size `--client-batch auto` plans on this card from one client's (`auto_n`), the projection
  from its best per-client round (`--batched`: this part alone; `--ns 1,8,32` for other group sizes, `--round-ns`
  for the rounds' own);
- the batched step's variants at N = 32 (bench/variants.py: strict float32, TF32, bf16 autocast, a replayed CUDA
  graph), each one's time and distance from the float32 step;
- `fedl2p run quickstart`'s wall time and meta-train ids on the GPU, as shipped (batched by default) and with every
  stage's clients one at a time (`--quickstart`: this part alone).
Not in the plain run: `--syncs`, the host syncs CUDA reports in one client round, one client at a time and a batched
group of 8; `--profile`, one round's syncs and heaviest operators, printed. `--merge` adds the parts run to those an
earlier call wrote to bench/gpu.json on the same card (scripts/gpu-session.sh: each part under its own time cap).
Timings synchronise the device before reading the clock; steps and rounds are medians of repetitions.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(1, str(HERE.parent))  # the package; bench/ stays first, for bench.py

CIFAR = dict(channels=3, size=32, classes=10, train=36, val=12, epochs=15, iterations=3, batch=32)


def timed(fns: dict, reps: int) -> dict[str, float]:
    """Median seconds of each function, called in turns, with the device synchronised around each call."""
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            torch.cuda.synchronize()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def client(model_name: str, dev: torch.device, seed: int = 0):
    """A model on `dev`, its lambda, statistics and one CIFAR-shaped client (synthetic data)."""
    from fedl2p_cli import device, plugins
    from fedl2p_cli.core.bn import bn_layers
    from fedl2p_cli.core.client import ClientData
    from fedl2p_cli.core.finetune import ClientBN
    from fedl2p_cli.core.metanets import init_lambda
    from fedl2p_cli.core.stats import client_stats
    from fedl2p_cli.models import registry
    g = torch.Generator().manual_seed(seed)
    n = CIFAR["train"] + CIFAR["val"]
    x = torch.randn(n, CIFAR["channels"], CIFAR["size"], CIFAR["size"], generator=g)
    y = torch.randint(0, CIFAR["classes"], (n,), generator=g)
    m = registry.build(model_name, CIFAR["channels"], CIFAR["classes"], catalog=plugins.current()).to(dev).eval()
    x, y = x.to(dev), y.to(dev)
    tr = CIFAR["train"]
    data = ClientData((x[:tr], y[:tr]), (x[tr:], y[tr:]), (x[:0], y[:0]))
    st = client_stats(m, data.train[0])
    theta = {k: v.detach().clone() for k, v in m.named_parameters()}
    lam = device.move(init_lambda(len(st.xi), len(st.x), len(theta), 1e-3, "both", 0), dev)
    bn = ClientBN(st.bn_mean, st.bn_var)
    assert len(bn_layers(m)) == len(st.xi)
    return m, theta, lam, st, bn, data


def steps(model_name: str, dev: torch.device) -> dict:
    import torch.nn.functional as F

    from bench import plain_model  # bench/bench.py, beside this file (sys.path[0])
    from fedl2p_cli.core.finetune import ClientBN, Strategy, sgd_step
    from fedl2p_cli.core.hypergrad import fomaml_gradient, ift_hypergradient
    from fedl2p_cli.core.metanets import hyperparameters
    m, theta, lam, st, bn, data = client(model_name, dev)
    x, y = data.train[0][:32], data.train[1][:32]
    hyper = lambda l: hyperparameters(l, st.xi, st.x, len(theta), 1e-3, 1.0)  # noqa: E731
    _, eta = (t.detach() for t in hyper(lam))
    mixed = Strategy(torch.full_like(st.xi, 0.5), eta)
    plain = plain_model(m)
    opt = torch.optim.SGD(plain.parameters(), lr=1e-3)

    def plain_step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(plain(x), y).backward()
        opt.step()

    fns = {"plain": plain_step,
           "mixed": lambda: sgd_step(m, theta, x, y, mixed, ClientBN(list(bn.mean), list(bn.var))),
           "hyper_fo": lambda: ift_hypergradient(m, theta, lam, hyper, (x, y), (x, y), bn, hessian="fo"),
           "fomaml": lambda: fomaml_gradient(m, theta, lam, hyper, (x, y), (x, y), bn)}
    t = timed(fns, 20)
    return {"plain_step_s": t["plain"], "mixed_step_vs_plain": t["mixed"] / t["plain"],
            "hyper_fo_vs_mixed_step": t["hyper_fo"] / t["mixed"], "fomaml_vs_mixed_step": t["fomaml"] / t["mixed"]}


def round_one(model_name: str, dev: torch.device, meta_grad: str) -> float:
    from fedl2p_cli.algorithms.fedl2p import client_update
    from fedl2p_cli.configs import meta_of
    m, theta, lam, st, bn, data = client(model_name, dev)
    cfg = meta_of("fomaml", iterations=CIFAR["iterations"], epochs=CIFAR["epochs"], batch_size=CIFAR["batch"], meta_grad=meta_grad)
    return timed({"r": lambda: client_update(m, theta, lam, st.xi, st.x, bn, data, cfg, torch.Generator().manual_seed(0))}, 5)["r"]


def _worker_round(task: tuple) -> float:
    model_name, meta_grad, reps = task
    dev = torch.device("cuda", 0)
    t0 = time.perf_counter()
    for _ in range(reps):
        round_one_once(model_name, dev, meta_grad)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


_CACHE: dict = {}


def round_one_once(model_name: str, dev: torch.device, meta_grad: str) -> None:
    from fedl2p_cli.algorithms.fedl2p import client_update
    from fedl2p_cli.configs import meta_of
    if model_name not in _CACHE:
        _CACHE[model_name] = client(model_name, dev)
    m, theta, lam, st, bn, data = _CACHE[model_name]
    cfg = meta_of("fomaml", iterations=CIFAR["iterations"], epochs=CIFAR["epochs"], batch_size=CIFAR["batch"], meta_grad=meta_grad)
    client_update(m, theta, lam, st.xi, st.x, bn, data, cfg, torch.Generator().manual_seed(0))


def concurrency(model_name: str, meta_grad: str, procs: int, per_proc: int = 6) -> float:
    """Client updates per second with `procs` processes sharing the GPU (each warmed up first)."""
    import multiprocessing as mp
    with mp.get_context("spawn").Pool(procs) as pool:
        pool.map(_worker_round, [(model_name, meta_grad, 1)] * procs)  # CUDA contexts, cuDNN plans, caches
        t0 = time.perf_counter()
        pool.map(_worker_round, [(model_name, meta_grad, per_proc)] * procs)
        return procs * per_proc / (time.perf_counter() - t0)


def pretrain_client_s(dev: torch.device) -> float:
    """One FedAvg client of the CIFAR-10 pipeline (36 train images, 1 local epoch, batch 32) on ResNet-18-cifar."""
    from fedl2p_cli.algorithms.local import LocalConfig, sgd_client
    from fedl2p_cli.core.functional import get_state
    m, _, _, _, _, data = client("resnet18-cifar", dev)
    state = get_state(m)
    cfg = LocalConfig(epochs=1, batch_size=32, head="fc.")
    return timed({"c": lambda: sgd_client(m, state, *data.train, 0.1, cfg, torch.Generator().manual_seed(0))}, 10)["c"]


# worker processes sharing the GPU: the full sweep where the projection reads it (ResNet-18, IFT), two points elsewhere,
# so that the whole benchmark fits a few minutes of a lent GPU
CONCURRENCY = {("resnet18-cifar", "ift"): (1, 2, 4, 8)}


def profile_round(model_name: str, meta_grad: str, dev: torch.device, top: int = 25) -> None:
    """`--profile`: one client round's host syncs (by source line) and its heaviest operators, printed."""
    import collections
    import warnings

    from torch.profiler import ProfilerActivity, profile
    round_one_once(model_name, dev, meta_grad)  # warm: cuDNN plans, caches
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        round_one_once(model_name, dev, meta_grad)
        torch.cuda.set_sync_debug_mode("default")
    where = collections.Counter(f"{Path(w.filename).name}:{w.lineno}" for w in seen)
    print(f"{model_name} {meta_grad}: {sum(where.values())} host syncs in one client round", dict(where.most_common(12)))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        round_one_once(model_name, dev, meta_grad)
        torch.cuda.synchronize()
    for key in ("self_cpu_time_total", "self_device_time_total"):  # host overhead, then the GPU's own work
        print(prof.key_averages().table(sort_by=key, row_limit=top), flush=True)


def sync_counts(out: dict, dev: torch.device, n: int = 8) -> None:
    """`--syncs`: the host syncs CUDA reports (`torch.cuda.set_sync_debug_mode("warn")`) in one small-CNN FedL2P client
    round of the CIFAR-10 pipeline's shape, one client at a time and a batched group of `n` (per group and per
    client), for FOMAML+ and the IFT; by source line in the output."""
    import collections
    import warnings

    import batching  # bench/batching.py

    from fedl2p_cli.configs import meta_of
    m, theta, lam, cl = batching.clients("small-cnn", n, dev)
    rec = out.setdefault("host_syncs_per_round", {"n": n, "model": "small-cnn"})
    for mg in ("fomaml", "ift"):
        cfg = meta_of("fomaml", iterations=CIFAR["iterations"], epochs=CIFAR["epochs"], batch_size=CIFAR["batch"], meta_grad=mg)
        runs = _round_fns(m, theta, lam, cl, cfg)
        for name, fn in runs.items():
            fn()  # warm
            torch.cuda.synchronize(dev)
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    fn()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            where = collections.Counter(f"{Path(w.filename).name}:{w.lineno}" for w in seen)
            rec[f"{mg}_{name}"] = {"total": sum(where.values()), "sites": dict(where.most_common(10))}
            print("syncs", mg, name, rec[f"{mg}_{name}"], flush=True)
    (HERE / "gpu.json").write_text(json.dumps(out, indent=2))


def _round_fns(m, theta, lam, cl, cfg) -> dict:
    """One client's round (the first of `cl`) and the group's, as functions of nothing."""
    from fedl2p_cli.algorithms.fedl2p import client_update, client_update_many
    d, st, bn = cl[0]
    return {"one_client": lambda: client_update(m, theta, lam, st.xi, st.x, bn, d, cfg, torch.Generator().manual_seed(0)),
            "group": lambda: client_update_many(m, theta, [lam] * len(cl), [(c[1].xi, c[1].x) for c in cl],
                                                [c[2] for c in cl], [c[0] for c in cl], cfg,
                                                [torch.Generator().manual_seed(c) for c in range(len(cl))])}


def _ns(flag: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """Group sizes from `flag 1,8,32` on the command line, else `default`."""
    if flag in sys.argv:
        return tuple(int(n) for n in sys.argv[sys.argv.index(flag) + 1].split(","))
    return default


def batched(out: dict, dev: torch.device) -> None:
    """The batched executor against one client at a time, in this run on this card: per-client step and round
    (FOMAML+ and IFT, the CIFAR-10 pipeline's client) at N = 1, 8, 32, 128, with peak memory per N; then the
    CIFAR-10 projection from the best per-client round."""
    ns = _ns("--ns", (1, 8, 32, 128))
    round_ns = _ns("--round-ns", ns)
    for name in ("resnet18-cifar", "small-cnn"):
        r = out.setdefault("batched", {}).setdefault(name, {})
        batched_model(r, name, dev, ns, round_ns, lambda: (HERE / "gpu.json").write_text(json.dumps(out, indent=2)))
        print("batched", name, json.dumps(r, indent=1), flush=True)
    r18 = out["batched"]["resnet18-cifar"]
    for mg in ("fomaml", "ift"):
        best = min(v["per_client_s"] for v in r18[f"{mg}_round"].values())
        out.setdefault("projection_batched_h", {})[f"meta_train_500_rounds_x_100_clients_{mg}"] = 500 * 100 * best / 3600
    (HERE / "gpu.json").write_text(json.dumps(out, indent=2))


def batched_model(r: dict, name: str, dev: torch.device, ns: tuple[int, ...], round_ns: tuple[int, ...],
                  save=lambda: None) -> dict:
    """One model's part of `batched` into `r`: the step at each of `ns`, FOMAML+'s and the IFT's rounds at each of
    `round_ns` (the CIFAR-10 pipeline's client); `save()` after each part, so that it survives a time limit."""
    import batching  # bench/batching.py
    r["step"] = batching.step_per_client(name, dev, ns)
    save()
    for mg in ("fomaml", "ift"):
        r[f"{mg}_round"] = batching.round_per_client(name, dev, mg, round_ns, CIFAR["epochs"], CIFAR["iterations"])
        save()
    return r


def quickstart(out: dict) -> None:
    """`fedl2p --device cuda run quickstart` in a fresh store: as shipped (the GPU's default: every stage's clients in
    vmapped groups) and with every stage's clients one at a time; the wall time and the meta-train ids of each."""
    import subprocess
    import tempfile
    cli = [sys.executable, "-m", "fedl2p_cli"]
    shown = subprocess.run([*cli, "run", "quickstart", "--show"], capture_output=True, text=True, check=True).stdout
    for label, text in (("default", shown), ("one_at_a_time", one_at_a_time(shown))):
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "quickstart.toml").write_text(text)
            t0 = time.perf_counter()
            r = subprocess.run([*cli, "--device", "cuda", "run", str(Path(d) / "quickstart.toml"), "--store",
                                str(Path(d) / "store")], capture_output=True, text=True)
            out.setdefault("quickstart_s", {})[label] = time.perf_counter() - t0 if r.returncode == 0 else r.stderr[-300:]
            out.setdefault("quickstart_meta_train_ids", {})[label] = _ids(Path(d) / "store", "meta-train")
        (HERE / "gpu.json").write_text(json.dumps(out, indent=2))
        print("quickstart", label, out["quickstart_s"][label], flush=True)


def one_at_a_time(text: str) -> str:
    """A pipeline file (`run --show`'s) with every stage's clients one at a time: `engine = "local"` in [pretrain] and
    [[meta-train]] (their workers stay), `client_batch = 1` in [personalize]."""
    out = []
    for line in text.splitlines():
        if line.split("=")[0].strip() in ("engine", "client_batch"):
            continue
        out.append(line)
        head = line.split("#")[0].strip()
        if head in ("[pretrain]", "[[meta-train]]"):
            out.append('engine = "local"')
        elif head == "[personalize]":
            out.append("client_batch = 1")
    return "\n".join(out) + "\n"


def _ids(root: Path, stage: str) -> list[str]:
    """The ids of a store's artifacts of `stage`, sorted (a GPU run's quickstart ids, to compare with the CPU's)."""
    from fedl2p_cli.artifacts import Store
    return sorted(Store(root).ids(stage)) if root.exists() else []


def _earlier(out: dict) -> dict:
    """bench/gpu.json as an earlier call wrote it, if the same card, torch and CUDA wrote it; else `out` alone."""
    try:
        old = json.loads((HERE / "gpu.json").read_text())
    except (OSError, ValueError):
        return out
    same = all(old.get(k) == v for k, v in out.items())
    return old | out if same else out


def main() -> None:
    if not torch.cuda.is_available():
        print("bench-gpu: no CUDA device here; nothing measured")
        return
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda", 0)
    if "--profile" in sys.argv:
        for name in ("resnet18-cifar", "small-cnn"):
            print(name, json.dumps(steps(name, dev)), flush=True)
        profile_round("resnet18-cifar", "ift", dev)
        return
    out: dict = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "cuda": torch.version.cuda}
    if "--merge" in sys.argv:  # add to the parts an earlier call of this session wrote (each part under its own cap)
        out = _earlier(out)
    if {"--batched", "--quickstart", "--syncs"} & set(sys.argv):  # these parts alone
        if "--syncs" in sys.argv:
            sync_counts(out, dev)
        if "--batched" in sys.argv:
            batched(out, dev)
        if "--quickstart" in sys.argv:
            quickstart(out)
        return
    t0 = time.perf_counter()
    for name in ("resnet18-cifar", "small-cnn"):
        r = steps(name, dev)
        for mg in ("fomaml", "ift"):
            torch.cuda.reset_peak_memory_stats(dev)
            r[f"{mg}_client_round_s"] = round_one(name, dev, mg)
            r[f"{mg}_peak_gpu_mb"] = torch.cuda.max_memory_allocated(dev) / 2**20
            r[f"{mg}_updates_per_s"] = {n: concurrency(name, mg, n) for n in CONCURRENCY.get((name, mg), (1, 4))}
        out[name] = r
        print(name, f"({time.perf_counter() - t0:.0f} s)", json.dumps(r, indent=1), flush=True)
        (HERE / "gpu.json").write_text(json.dumps(out, indent=2))  # what is measured so far survives a time limit
    r18 = out["resnet18-cifar"]
    best = max(r18["ift_updates_per_s"].values())
    pre = pretrain_client_s(dev)
    out["projection_cifar10_a0.1_h"] = {
        "pretrain_500_rounds_x_100_clients": 500 * 100 * pre / 3600,
        "meta_train_500_rounds_x_100_clients_ift": 500 * 100 / best / 3600,
        "meta_train_per_round_s_ift": 100 / best,
        "note": "pretraining clients one at a time; meta-training at the best measured concurrency"}
    (HERE / "gpu.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out["projection_cifar10_a0.1_h"], indent=1))
    batched(out, dev)
    (HERE / "gpu.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out["projection_batched_h"], indent=1))
    import variants  # bench/variants.py: the batched step in float32, strict float32, TF32, bf16 and as a CUDA graph
    out["variants"] = variants.main(["--device", "cuda", "--n", "32"])
    (HERE / "gpu.json").write_text(json.dumps(out, indent=2))
    quickstart(out)


if __name__ == "__main__":
    main()
