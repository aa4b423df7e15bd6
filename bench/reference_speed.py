"""`make bench-reference-speed REF=PATH`: one client's round, its fine-tuning and its meta-gradient, ours beside the
authors' client (royson/fedl2p), timed in turns in one process at one torch thread.

Both sides get the same model (theirs with their KLD batch norm and plain nn.Conv2d), the same client tensors
(synthetic: speed does not depend on their values), batch 32, e = 5 epochs, one meta-iteration (our K = 1; their
validation split is one batch, so their `outer_loop_epochs` = 1 is one meta-step), Q = 3. Ours: `client_update` with
`fedl2p meta-train`'s defaults (the stable IFT), or `--meta-grad fomaml` (FOMAML+). Theirs: their client's `fit()`
with their IFT (`Hypergrad`, psi 0.1, Q 3) or their FOMAML.

Phases. Ours: fine-tuning = `finetune` less PreciseBN; then PreciseBN, the validation loss recorded each round and
the meta-gradient (`meta_gradient`), each timed by wrapping the function. Theirs, from the calls their `fit()` makes:
fine-tuning = from the learner's clone to its `eval()` (their inner loop, betas and LR masks included), meta-gradient
= from that `eval()` to the meta-nets' first optimizer step (the validation forward, their IFT's train forward and
hypergradient, or FOMAML's backward); their per-round KLD and feature statistics are timed apart. Counts per round:
forwards of the network (a forward hook), first-order gradients and second-order products (bench/counting.py).

Ratios are theirs / ours of medians: above 1, ours is faster. Writes bench/reference-speed.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from fedl2p_cli.analysis import tables

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from counting import count_backward  # noqa: E402
from refclient import Shared, client_kwargs, import_reference, reference_config, their_model  # noqa: E402

MODELS = {"small-cnn": {"channels": 1, "train": 128, "reps": 7},
          "resnet18-cifar": {"channels": 3, "train": 64, "reps": 2}}
VAL = 32  # one validation batch: one meta-step per round on both sides
CFG = {"batch_size": 32, "iterations": 1, "epochs": 5, "base_lr": 0.01}
ALGOS = {"IFT": ("ift", "IFT"), "FOMAML+": ("fomaml", "FOMAML")}  # label: (our --meta-grad, their meta_algorithm)
PHASES = ("round", "finetune", "meta_gradient")


class Clock:
    """Named events and timed sections of one call."""

    def __init__(self):
        self.events: list[tuple[str, float]] = []
        self.sections: dict[str, float] = {}

    def stamp(self, name: str) -> None:
        self.events.append((name, time.perf_counter()))

    def timed(self, name: str, fn):
        def wrapped(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.sections[name] = self.sections.get(name, 0.0) + time.perf_counter() - t
        return wrapped

    def between(self, start: str, end: str) -> float:
        """Total time from each `start` event to the first `end` event after it."""
        total, opened = 0.0, None
        for name, t in self.events:
            if name == start:
                opened = t
            elif name == end and opened is not None:
                total, opened = total + t - opened, None
        return total


CLOCK = Clock()


class StampSGD(torch.optim.SGD):
    """Their meta-nets' optimizer (SGD, as in their configs) that notes each step: the end of their meta-gradient."""

    def step(self, *a, **k):
        CLOCK.stamp("step")
        return super().step(*a, **k)


@contextmanager
def patched(obj, name: str, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def client_data(channels: int, n_train: int):
    from fedl2p_cli.core.client import ClientData
    g = torch.Generator().manual_seed(0)
    split = lambda n: (torch.randn(n, channels, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g))  # noqa: E731
    return ClientData(split(n_train), split(VAL), split(VAL))


class OnePart:
    """What RefData reads: our partition's `client(cid)`, here one client."""

    def __init__(self, data):
        self.data = data

    def client(self, cid: int):
        return self.data


def ours(model, data, meta_grad: str):
    """A callable running our client round; it fills CLOCK's sections."""
    from fedl2p_cli.algorithms import fedl2p as alg
    from fedl2p_cli.configs import meta_of
    from fedl2p_cli.core import finetune as ft
    from fedl2p_cli.core import hypergrad as hg
    from fedl2p_cli.core.bn import bn_layers
    from fedl2p_cli.core.finetune import ClientBN
    from fedl2p_cli.core.metanets import init_lambda
    from fedl2p_cli.core.stats import stat_layers
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    n_bn, n_x = len(bn_layers(model)), 2 * len(stat_layers(model))
    lam = init_lambda(n_bn, n_x, len(theta), CFG["base_lr"], "both", 0)
    g = torch.Generator().manual_seed(1)
    xi, xs = torch.rand(n_bn, generator=g), torch.randn(n_x, generator=g)
    bn0 = ClientBN([b.running_mean.clone() for _, b in bn_layers(model)], [b.running_var.clone() for _, b in bn_layers(model)])
    cfg = meta_of("fomaml", iterations=CFG["iterations"], epochs=CFG["epochs"], batch_size=CFG["batch_size"],
                     base_lr=CFG["base_lr"], meta_grad=meta_grad)

    def run():
        with patched(alg, "finetune", CLOCK.timed("finetune", alg.finetune)), \
                patched(ft, "precise_bn", CLOCK.timed("precise_bn", ft.precise_bn)), \
                patched(alg, "personalized_accuracy", CLOCK.timed("val_loss", alg.personalized_accuracy)), \
                patched(alg, "meta_gradient", CLOCK.timed("meta_gradient", alg.meta_gradient)), \
                patched(hg, "val_loss", CLOCK.timed("mg_val_forward", hg.val_loss)), \
                patched(hg, "train_loss", CLOCK.timed("mg_train_loss", hg.train_loss)), \
                patched(hg, "krylov", CLOCK.timed("mg_krylov", hg.krylov)):
            alg.client_update(model, theta, lam, xi, xs, bn0, data, cfg, torch.Generator().manual_seed(0))
    return run


def theirs(client_mod, model_utils, algo: str, weights: Path):
    """A callable running their client's fit() once (the client built beforehand); it fills CLOCK's events."""
    config = reference_config(CFG, 1, weights, optimizer=f"{__name__}.StampSGD")
    kwargs = client_kwargs(CFG, 1, meta_algorithm=algo)
    make = lambda: client_mod.FedL2PClassificationClient("0", type("Ckp", (), {"config": config})(), **kwargs)  # noqa: E731
    params = make().get_parameters()
    rc = {"current_round": 1, "inner_lr": CFG["base_lr"], "bn_net_lr": 1e-3, "lr_net_lr": 1e-3}
    learner = client_mod.MAMLwLRs

    def clone(self, *a, **k):
        CLOCK.stamp("clone")
        return learner_clone(self, *a, **k)

    def eval_(self):
        CLOCK.stamp("eval")
        return torch.nn.Module.eval(self)

    learner_clone = learner.clone

    def run():
        cl = make()
        torch.manual_seed(0)
        with patched(learner, "clone", clone), patched(learner, "eval", eval_), \
                patched(client_mod, "precompute_kld", CLOCK.timed("stats", client_mod.precompute_kld)), \
                patched(client_mod, "precompute_feat_stats", CLOCK.timed("stats", client_mod.precompute_feat_stats)):
            t = time.perf_counter()
            cl.fit(params, rc, num_workers=0)
            CLOCK.sections["round"] = time.perf_counter() - t
    return run


def phases(side: str) -> dict[str, float]:
    s = CLOCK.sections
    if side == "ours":
        mg = {k: s.get(k, 0.0) for k in ("mg_val_forward", "mg_train_loss", "mg_krylov")}
        return {"round": s["round"], "finetune": s["finetune"] - s.get("precise_bn", 0.0),
                "precise_bn": s.get("precise_bn", 0.0), "val_loss": s.get("val_loss", 0.0),
                "meta_gradient": s["meta_gradient"], **mg, "mg_rest": s["meta_gradient"] - sum(mg.values())}
    return {"round": s["round"], "finetune": CLOCK.between("clone", "eval"),
            "meta_gradient": CLOCK.between("eval", "step"), "stats": s.get("stats", 0.0)}


def timed_call(side: str, fn) -> dict[str, float]:
    global CLOCK
    CLOCK = Clock()
    t = time.perf_counter()
    fn()
    CLOCK.sections.setdefault("round", time.perf_counter() - t)
    return phases(side)


def counted(fn, net: torch.nn.Module, modules: tuple) -> dict[str, int]:
    """Forwards of `net`, first-order gradients and second-order products of one call."""
    n = [0]
    hook = net.register_forward_hook(lambda *_: n.__setitem__(0, n[0] + 1))
    try:
        with count_backward(modules) as c:
            fn()
    finally:
        hook.remove()
    return {"forwards": n[0], "gradients": c.first_order, "second_order": c.second_order}


def bench_model(name: str, reps: int, client_mod, model_utils) -> dict:
    from fedl2p_cli import plugins
    from fedl2p_cli.models import registry
    spec = MODELS[name]
    torch.manual_seed(0)
    model = registry.build(name, spec["channels"], 10, catalog=plugins.current())
    data = client_data(spec["channels"], spec["train"])
    Shared.part, Shared.template = OnePart(data), their_model(model, model_utils, native_conv=True)
    with tempfile.TemporaryDirectory() as d:
        weights = Path(d) / "weights.pt"
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, weights)
        fns = {(algo, side): (ours(model, data, ALGOS[algo][0]) if side == "ours"
                              else theirs(client_mod, model_utils, ALGOS[algo][1], weights))
               for algo in ALGOS for side in ("ours", "theirs")}
        counts = {f"{a}/{s}": counted(fn, model if s == "ours" else Shared.template, (client_mod,))
                  for (a, s), fn in fns.items()}  # also the warm-up call of each
        times = {f"{a}/{s}": [] for a, s in fns}
        for r in range(reps):
            for (a, s), fn in fns.items():
                times[f"{a}/{s}"].append(timed_call(s, fn))
            print(f"  {name}: repetition {r + 1}/{reps} done (load {os.getloadavg()[0]:.1f})", flush=True)
    med = {k: {p: statistics.median(t[p] for t in v) for p in v[0]} for k, v in times.items()}
    return {"train_samples": spec["train"], "reps": reps, "counts": counts, "median_s": med,
            "speed_ratio": {a: {p: med[f"{a}/theirs"][p] / med[f"{a}/ours"][p] for p in PHASES} for a in ALGOS}}


def machine() -> dict:
    from fedl2p_cli.runtime import cpu_model
    return {"cpu": cpu_model(), "capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "cores": os.cpu_count()}


def render(res: dict) -> str:
    m = res["machine"]
    lines = ["# bench-reference-speed: one client round, ours vs the authors' client", "",
             f"{m['cpu']}, `{m['capability']}`, torch {m['torch']}, {m['threads']} thread; load average "
             f"{res['load'][0]:.1f} at the start, {res['load'][1]:.1f} at the end ({m['cores']} cores).", "",
             *tables.lines(["model", "meta-gradient", "side", "round (s)", "fine-tuning (s)", "meta-gradient (s)", "forwards",
                            "gradients", "second-order products"], speed_rows(res))]
    lines += ["", "Ratios are of medians, theirs ÷ ours: above 1, ours is faster. Our round also holds PreciseBN and "
              "the recorded validation loss; theirs their per-round KLD and feature statistics (seconds in the json).",
              "", "Where our stable-IFT round's time goes (medians; share of the round):", "",
              *tables.lines(["part", *res["models"]], share_rows(res))]
    return "\n".join(lines)


def speed_rows(res: dict) -> list[list]:
    """Per model and meta-gradient: each side's median times and counts, then theirs ÷ ours."""
    rows: list[list] = []
    for name, r in res["models"].items():
        for a in ALGOS:
            for s in ("ours", "theirs"):
                t, c = r["median_s"][f"{a}/{s}"], r["counts"][f"{a}/{s}"]
                rows.append([f"{name} ({r['train_samples']} samples, {r['reps']} reps)", a, s, f"{t['round']:.3f}",
                             f"{t['finetune']:.3f}", f"{t['meta_gradient']:.3f}", c["forwards"], c["gradients"],
                             c["second_order"]])
            q = r["speed_ratio"][a]
            rows.append(["", a, "**theirs ÷ ours**", f"**{q['round']:.2f}×**", f"**{q['finetune']:.2f}×**",
                         f"**{q['meta_gradient']:.2f}×**", "", "", ""])
    return rows


def share_rows(res: dict) -> list[list[str]]:
    """Per part of our stable-IFT round (SHARES): its median seconds and share of the round, per model."""
    rows = []
    for key, label in SHARES:
        cells = []
        for r in res["models"].values():
            t = r["median_s"]["IFT/ours"]
            v = t["round"] - sum(t[k] for k in OWN) if key == "other" else t[key]
            cells.append(f"{v:.3f} s ({v / t['round']:.0%})")
        rows.append([label, *cells])
    return rows

OWN = ("finetune", "precise_bn", "val_loss", "meta_gradient")  # our round's timed parts
SHARES = [("finetune", "fine-tuning: e epochs of SGD steps"), ("precise_bn", "PreciseBN's pass"),
          ("val_loss", "the validation loss recorded each round"), ("meta_gradient", "the meta-gradient"),
          ("mg_val_forward", "  its L_V forward"),
          ("mg_train_loss", "  its L_T at the `star` point: the in-graph step's forward and gradient, then L_T's forward"),
          ("mg_krylov", "  its Q Hessian-vector products (Krylov)"),
          ("mg_rest", "  the rest: L_V's and L_T's gradients, the mixed product, eta's last-step term"),
          ("other", "the rest of the round (lambda to beta and eta, the meta-net update)")]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", type=Path, required=True, help="a clone of the authors' repository (royson/fedl2p)")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--reps", type=int, default=0, help="repetitions per model (0: 7 small CNN, 2 ResNet-18-cifar)")
    a = ap.parse_args(argv)
    client_mod, model_utils = import_reference(a.ref.resolve())
    torch.set_num_threads(1)
    res = {"machine": machine(), "models": {}}
    load0 = os.getloadavg()[0]
    for name in a.models:
        print(f"[speed] {name}", flush=True)
        res["models"][name] = bench_model(name, a.reps or MODELS[name]["reps"], client_mod, model_utils)
    res["load"] = [load0, os.getloadavg()[0]]
    (HERE / "reference-speed.json").write_text(json.dumps(res, indent=1))
    report = render(res)
    (HERE / "reference-speed.md").write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
