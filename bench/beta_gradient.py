"""`python bench/beta_gradient.py [CELL]`: is the stable IFT's meta-gradient with respect to each BN layer's beta the
derivative of the objective it stands for?

On every seen client of a `bench/budget.py` run (the stable IFT, meta-train seed 0, 20 rounds), at the initial
lambda and at the run's last lambda: the client's beta and learning rates are read from lambda; then
- the IFT estimate: `meta_gradient` (Alg. 2, the run's own settings) with the beta and learning rates themselves as the
  meta-parameters (an identity in place of BNNet/LRNet), so its `beta` entry is dL_V/dbeta per layer, as meta-training
  forms it on one validation batch;
- the finite difference: fine-tune again with one layer's beta moved by +-DELTA (the same fine-tuning batches), and
  the central difference of the validation loss on the client's whole validation split: the derivative of the
  meta-objective itself (fine-tune e epochs under (beta, eta), then the validation loss), which `bench/objective.py`
  scores. Both with the run's client BN (`precise`), and the finite difference again with `running` client BN (the
  statistics fine-tuning ends with, not recomputed), which the IFT's fixed fine-tuned statistics resemble.
Mean over clients, the share of clients where the IFT and the finite difference agree in sign, and their correlation
across clients. Writes bench/beta-gradient.json and bench/beta-gradient.md.

`--unrolled` adds, to the measurements in bench/beta-gradient.json, the derivative the IFT approximates, computed
exactly: every fine-tuning step differentiated (the same batches, create_graph), with the client BN statistics held
at those fine-tuning ends with, as the IFT holds them, and the validation loss on the whole split. Where the IFT
differs from it, the IFT's own approximation is to blame (theta* taken as a stationary point of L_T, the truncated
Neumann series, L_T on one batch); where it differs from the finite difference, the statistics held fixed are.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from fedl2p_cli import plugins
from fedl2p_cli.analysis import tables

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import objective  # noqa: E402

DELTA = 0.05  # beta's step for the central difference (beta stays inside (0, 1) at the lambdas measured)
EVAL_SEED = objective.EVAL_SEED


def per_client(ctx, lam, c: int, fd: bool = True) -> dict:
    import torch

    from fedl2p_cli.algorithms.fedl2p import hyper_fn, meta_gradient
    from fedl2p_cli.core.finetune import Strategy, finetune, personalized_accuracy
    from fedl2p_cli.engine.loop import generator
    cfg = ctx.cfg.meta
    data = ctx.part.client_on(c, torch.device("cpu"))
    with torch.no_grad():
        beta, eta = hyper_fn(*ctx.inputs(c), len(ctx.theta_g), cfg)(lam)

    def tuned(b: torch.Tensor, client_bn: str):
        """Fine-tuning under (b, eta) on the client's fixed batches: the strategy and its result."""
        s = Strategy(b, eta)
        return s, finetune(ctx.model, ctx.theta_g, *data.train, s, ctx.stats.client_bn(c), cfg.epochs, cfg.batch_size,
                           generator(EVAL_SEED, c), client_bn)

    def val_loss(b: torch.Tensor, client_bn: str) -> float:
        s, ft = tuned(b, client_bn)
        return personalized_accuracy(ctx.model, ft.params, *data.val, s, ft.bn, cfg.batch_size, cfg.val_stats)[0]

    out: dict = {"beta": beta.tolist()}
    for mode in ("precise", "running") if fd else ():
        fd_ = []
        for layer in range(len(beta)):
            step = torch.zeros_like(beta)
            step[layer] = DELTA
            fd_.append((val_loss(beta + step, mode) - val_loss(beta - step, mode)) / (2 * DELTA))
        out[f"fd_{mode}"] = fd_
    _, ft = tuned(beta, cfg.client_bn)
    direct = {"beta": beta.clone(), "eta": eta.clone()}
    ift = [meta_gradient(ctx.model, ft, direct, lambda lm: (lm["beta"], lm["eta"]), data, cfg,
                         generator(EVAL_SEED, c, k)).grads["beta"].tolist() for k in range(4)]  # 4 validation batches
    out["ift"] = np.mean(ift, axis=0).tolist()
    return out


def unrolled(ctx, lam, c: int) -> list[float]:
    """dL_V/dbeta per layer through every fine-tuning step (see the module docstring)."""
    import torch

    from fedl2p_cli.algorithms.fedl2p import hyper_fn
    from fedl2p_cli.core.bn import BNPolicy
    from fedl2p_cli.core.finetune import Strategy, finetune
    from fedl2p_cli.core.functional import ce_loss, epochs_of_batches
    from fedl2p_cli.core.hypergrad import val_loss
    from fedl2p_cli.engine.loop import generator
    cfg = ctx.cfg.meta
    data = ctx.part.client_on(c, torch.device("cpu"))
    (x, y), val = data.train, data.val
    with torch.no_grad():
        beta, eta = hyper_fn(*ctx.inputs(c), len(ctx.theta_g), cfg)(lam)
    ft = finetune(ctx.model, ctx.theta_g, x, y, Strategy(beta, eta), ctx.stats.client_bn(c), cfg.epochs, cfg.batch_size,
                  generator(EVAL_SEED, c), cfg.client_bn)  # the statistics the IFT holds, and the end point to check
    b = beta.clone().requires_grad_(True)
    params = {k: v.detach().requires_grad_(True) for k, v in ctx.theta_g.items()}
    for idx in epochs_of_batches(len(y), cfg.batch_size, generator(EVAL_SEED, c), cfg.epochs, x.device):
        loss = ce_loss(ctx.model, params, x[idx], y[idx], BNPolicy(b, train=True))
        grads = torch.autograd.grad(loss, list(params.values()), create_graph=True)
        params = {k: v - lr * g for (k, v), lr, g in zip(params.items(), eta, grads)}
    drift = max(float((params[k].detach() - ft.params[k]).abs().max()) for k in params)
    assert drift < 1e-3, f"client {c}: the differentiated fine-tuning ends {drift:.2g} away from finetune's"
    return torch.autograd.grad(val_loss(ctx.model, params, b, val, ft.bn, cfg.val_stats), b)[0].tolist()


def add_unrolled(ctx, lam, m: dict) -> None:
    for c, r in zip(ctx.part.pool(False), m["clients"]):
        r["unrolled"] = unrolled(ctx, lam, c)
    print(f"unrolled {m['lambda']}", flush=True)


def measure(ctx, lam, label: str, fd: bool = True) -> dict:
    rows = [per_client(ctx, lam, c, fd) for c in ctx.part.pool(False)]
    print(f"measured {label}", flush=True)
    return {"lambda": label, "clients": rows}


def variant(ctx, lam0, settings: str, base: dict) -> dict:
    """`--meta k=v,...`: the IFT estimate at the initial lambda under other meta-gradient settings (the same clients,
    fine-tuning and validation batches), beside the finite differences already measured (`base`)."""
    pairs = dict(kv.split("=", 1) for kv in settings.split(","))
    meta = ctx.cfg.meta
    typed = {k: type(getattr(meta, k))(v) if not isinstance(getattr(meta, k), bool) else v == "true" for k, v in pairs.items()}
    ctx.cfg = replace(ctx.cfg, meta=replace(meta, **typed))
    m = measure(ctx, lam0, f"initial, {settings}", fd=False)
    for r, b in zip(m["clients"], base["clients"]):
        r.update(fd_precise=b["fd_precise"], fd_running=b["fd_running"])
    return m


def summary(m: dict) -> list[list]:
    rows = []
    for layer in range(len(m["clients"][0]["beta"])):
        get = lambda k, layer=layer: np.array([r[k][layer] for r in m["clients"]])  # noqa: E731
        ift, fdp, fdr = get("ift"), get("fd_precise"), get("fd_running")
        agree = np.mean(np.sign(ift) == np.sign(fdp))
        diff = ift - fdp
        corr = np.corrcoef(ift, fdp)[0, 1] if ift.std() > 0 and fdp.std() > 0 else float("nan")
        rows.append([m["lambda"], f"bn{layer}", f"{get('beta').mean():.2f}", f"{ift.mean():+.4f}", f"{fdp.mean():+.4f}",
                     f"{fdr.mean():+.4f}", _paired(diff), f"{100 * agree:.0f}%", f"{corr:.2f}"])
    return rows


def _paired(d) -> str:
    return f"{d.mean():+.3f} ± {d.std(ddof=1) / np.sqrt(len(d)):.3f}"


def unrolled_rows(m: dict) -> list[list]:
    """Per layer: the unrolled derivative beside the IFT and the finite difference, and the two gaps it separates."""
    rows = []
    for layer in range(len(m["clients"][0]["beta"])):
        get = lambda k, layer=layer: np.array([r[k][layer] for r in m["clients"]])  # noqa: E731
        ift, unr, fdp = get("ift"), get("unrolled"), get("fd_precise")
        rows.append([m["lambda"], f"bn{layer}", f"{ift.mean():+.4f}", f"{unr.mean():+.4f}", f"{fdp.mean():+.4f}",
                     _paired(ift - unr), _paired(unr - fdp), f"{100 * np.mean(np.sign(ift) == np.sign(unr)):.0f}%"])
    return rows


def report(measured: list[dict]) -> str:
    cols = ["lambda", "layer", "mean β", "IFT dL/dβ (mean)", "finite diff., precise BN", "finite diff., running BN",
            "IFT − finite diff. (paired, ± SE)", "sign agrees (IFT vs precise)", "correlation over clients"]
    text = tables.markdown(cols, [r for m in measured for r in summary(m)])
    done = [m for m in measured if all("unrolled" in r for r in m["clients"])]
    if done:
        text += "\n\n" + tables.markdown(
            ["lambda", "layer", "IFT", "unrolled, BN held", "finite diff., precise BN",
             "IFT − unrolled (paired, ± SE)", "unrolled − finite diff. (± SE)", "sign: IFT vs unrolled"],
            [r for m in done for r in unrolled_rows(m)])
    return text


def main() -> None:
    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.stages import meta_train
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    cell = args[0] if args else "fs-1000"
    if "--report" in sys.argv:
        print(report(json.loads((HERE / "beta-gradient.json").read_text())))
        return
    settings = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--meta=")), None)
    unroll = "--unrolled" in sys.argv
    arts = [a for a in objective.runs(cell) if a.config["meta"]["meta_grad"] == "ift" and a.config["seed"] == 0
            and a.config["rounds"] == 20 and a.config["keep"] == "last"]
    if not arts:
        raise SystemExit(f"beta_gradient: no 20-round stable-IFT run (seed 0, keep last) of {cell}; run bench/budget.py")
    art = arts[0]
    ctx, lam0 = objective.context(art)
    if settings:  # another meta-gradient setting at the initial lambda, added to beta-gradient.json
        measured = json.loads((HERE / "beta-gradient.json").read_text())
        measured.append(variant(ctx, lam0, settings, measured[0]))
        (HERE / "beta-gradient.json").write_text(json.dumps(measured, indent=1))
        print(report(measured))
        return
    _, lam, _ = meta_train.load_lambda(Store(objective.accuracy.STORE), art.id, plugins.current())
    if unroll:  # the exact derivative beside the measurements already made, at the same two lambdas
        measured = json.loads((HERE / "beta-gradient.json").read_text())
        for m, at in zip(measured[:2], (lam0, lam)):
            add_unrolled(ctx, at, m)
        (HERE / "beta-gradient.json").write_text(json.dumps(measured, indent=1))
        (HERE / "beta-gradient.md").write_text(report(measured) + "\n")
        print(report(measured))
        return
    measured = [measure(ctx, lam0, "initial"), measure(ctx, lam, "20 rounds, last")]
    (HERE / "beta-gradient.json").write_text(json.dumps(measured, indent=1))
    text = report(measured)
    (HERE / "beta-gradient.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
