"""How the batched fine-tuning step could run closer to the compute floor (issue 71's items 3 and 4), measured in one
run on one device: `python bench/variants.py [--device cuda] [--models small-cnn,resnet18-cifar] [--n 32] [--reps 5]
[--json FILE]`.

One beta-mixed SGD step of N clients as one vmapped computation (`core.batched`'s step, the group's first step of
`finetune_many`) on CIFAR-shaped synthetic clients (batch 32), per variant:
- `eager`: float32 as the package runs it (on a GPU with cuDNN's default TF32 convolutions);
- `fp32-strict`: TF32 off for convolutions and matrix products (true float32);
- `tf32`: TF32 on for matrix products too;
- `bf16`: the step under `torch.autocast` to bfloat16 (weights, statistics and the update stay float32);
- `graph`: the eager step captured once as a CUDA graph (fixed shapes: one graph per group shape) and replayed.
Each gives seconds per client (median of interleaved repetitions, the device synchronised around each call) and how
far its update of the weights lies from `eager`'s (max |difference| over max |eager's update|). The package runs only `eager`: the
others are candidates, to be chosen by these numbers and checked on the cells' accuracies before one becomes an option.
On the CPU `tf32` and `graph` are skipped (the CPU has neither); the rest runs, so the script is tested there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # the package

BATCH = 32


def step_inputs(model_name: str, n: int, dev: torch.device) -> tuple[Callable, tuple]:
    """The vmapped step of `n` clients and its inputs at the group's first step, as `finetune_many` builds them."""
    import batching  # bench/batching.py: the synthetic CIFAR-shaped clients
    from torch.func import vmap

    from fedl2p_cli.core.batched import Schedule, _gather, _plain, _step_fn, pad_data, stack, stack_bn
    from fedl2p_cli.core.functional import epochs_of_batches
    m, theta, _, cl = batching.clients(model_name, n, dev)
    xs = [d.train[0][:BATCH] for d, _, _ in cl]
    ys = [d.train[1][:BATCH] for d, _, _ in cl]
    n_bn = len(cl[0][2].mean)
    beta = torch.full((n, n_bn), 0.5, device=dev)
    lr = torch.full((n, len(theta)), 1e-3, device=dev)
    sched = Schedule.of([epochs_of_batches(len(y), BATCH, torch.Generator().manual_seed(c), 1)
                         for c, y in enumerate(ys)], dev)
    px, py = pad_data(xs, ys)
    mean, var = stack_bn([c[2] for c in cl])
    idx = sched.idx[:, 0]
    args = (stack([theta] * n), mean, var, _gather(px, idx), _gather(py, idx), sched.mask[:, 0], beta, lr,
            sched.active[:, 0])
    return _plain(vmap(_step_fn(m))), args


@contextlib.contextmanager
def precision(tf32_conv: bool, tf32_matmul: bool) -> Iterator[None]:
    """cuDNN's and cuBLAS's TF32 switches for the block (restored after it)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32_conv, tf32_matmul
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def variants(step: Callable, args: tuple, dev: torch.device) -> dict[str, Callable[[], dict]]:
    """Each variant as a function returning the step's new weights (a dict of tensors)."""
    cuda = dev.type == "cuda"
    default_conv = torch.backends.cudnn.allow_tf32

    def under(tf32_conv: bool, tf32_matmul: bool) -> Callable[[], dict]:
        def run() -> dict:
            with precision(tf32_conv, tf32_matmul):
                return step(*args)[0]
        return run

    def bf16() -> dict:
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            return step(*args)[0]

    out: dict[str, Callable[[], dict]] = {"eager": under(default_conv, False), "fp32-strict": under(False, False),
                                           "bf16": bf16}
    if cuda:
        out["tf32"] = under(True, True)
        try:
            out["graph"] = graphed(lambda: step(*args)[0], dev)
        except RuntimeError as e:  # a capture that fails (a host sync in the step) is a finding, not the run's end
            print(f"graph: not captured: {str(e).splitlines()[0][:200]}", flush=True)
    return out


def graphed(fn: Callable[[], dict], dev: torch.device, warmup: int = 3) -> Callable[[], dict]:
    """`fn` captured as one CUDA graph (its inputs fixed, as a group's are between steps of the same shape): warmed up
    on a side stream, captured, then each call replays it and returns the graph's output tensors."""
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = fn()

    def replay() -> dict:
        graph.replay()
        return static
    return replay


def distance(a: dict, b: dict, start: dict) -> float:
    """How far the update a - start lies from b - start: max |a - b| over max |b - start|, over every tensor."""
    diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in b)
    scale = max(float((b[k].double() - start[k].double()).abs().max()) for k in b)
    return diff / max(scale, 1e-30)


def measure(model_name: str, n: int, dev: torch.device, reps: int) -> dict:
    """Per-client seconds of each variant's step (interleaved repetitions) and its distance from `eager`."""
    from batching import sync
    step, args = step_inputs(model_name, n, dev)
    fns = variants(step, args, dev)
    ref = {k: v.clone() for k, v in fns["eager"]().items()}
    out: dict = {}
    for name, fn in fns.items():
        out[name] = {"update_vs_eager": distance(fn(), ref, args[0])}
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            sync(dev)
            t = time.perf_counter()
            fn()
            sync(dev)
            times[name].append(time.perf_counter() - t)
    for name, ts in times.items():
        out[name]["per_client_s"] = statistics.median(ts) / n
        out[name]["vs_eager"] = statistics.median(ts) / statistics.median(times["eager"])
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    ap.add_argument("--models", default="small-cnn,resnet18-cifar", help="models, comma-separated")
    ap.add_argument("--n", type=int, default=32, help="clients in the vmapped group")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions of each variant")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    a = ap.parse_args(argv)
    if a.device == "cpu":
        torch.set_num_threads(1)
    dev = torch.device(a.device)
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
    out: dict = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                 "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
                 "cuda": torch.version.cuda, "n": a.n, "batch": BATCH, "models": {}}
    for name in a.models.split(","):
        out["models"][name] = measure(name, a.n, dev, a.reps)
        print(name, json.dumps(out["models"][name], indent=1), flush=True)
        if a.json:
            a.json.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
