"""Does the learned LRs' meta-gradient see the whole fine-tuning? `python bench/lr_gradient.py CELL [CELL ...]`.

On real clients of a bench cell (pipelines/bench/CELL.toml: its partition, pretrained model and statistics, built or
reused), at every client's initial strategy (--head log at init: beta_init and the base LR for every client), one
number per client: dL_V / d log s, the validation loss's slope in a common scale s of every LR, three ways:
- finite differences over the whole fine-tuning (the truth): fine-tune at s = e^{+-h} with the same batches;
- `last-step`: FOMAML+'s and the IFT's default LR path, -dL_V/dtheta* . eta * g_last (the last step only);
- `trajectory` (--lr-grad trajectory): dL_V/dtheta* . (theta* - theta_g), the client's BN statistics held;
- `trajectory-bn` (--lr-grad trajectory-bn): the same, through the statistics recomputed from theta* (PreciseBN);
each also read from the code path meta-train runs (the sum of log eta~'s meta-gradient under --head log).
L_V is the client's whole validation set here (meta-train draws one batch of it), so the three differ only by the
path. Prints one row per client and the ratio of each estimate to the finite difference.

`--meta ID` (one cell): at a meta-train artifact's learned lambda instead, per parameter tensor k: dL_V/d log eta_k by
central differences of the whole fine-tuning (its statistics recomputed, as evaluation does) against each `--lr-grad`
entry's code path (log eta~'s meta-gradient under the run's head); per client, the common-scale sum's ratio and sign
and the per-tensor cosine.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import search  # noqa: E402  (the cells' pipeline files, through its `accuracy`)


def _val_loss(model, params, s, bn, xv, yv) -> torch.Tensor:
    from fedl2p_cli.core.finetune import eval_policy
    from fedl2p_cli.core.functional import ce_loss
    return ce_loss(model, params, xv, yv, eval_policy(s, bn))


def client_row(ctx, c: int, cfg, h: float, seed: int) -> dict:
    """The three slopes for client c at the log head's initial lambda."""
    from fedl2p_cli.algorithms import meta_grads
    from fedl2p_cli.algorithms.fedl2p import hyper_fn
    from fedl2p_cli.core.finetune import Strategy, finetune
    from fedl2p_cli.engine.loop import generator
    from fedl2p_cli.stages.meta_train import initial_lambda
    n_p = len(ctx.theta_g)
    xi, x = ctx.inputs(c)
    lam = initial_lambda(ctx.cfg, ctx.entries.head, len(xi), len(x), n_p)
    hyper = hyper_fn(xi, x, n_p, cfg)
    data, bn0 = ctx.part.client(c), ctx.stats.client_bn(c)
    (xt, yt), (xv, yv) = data.train, data.val
    with torch.no_grad():
        beta, eta = hyper(lam)

    def tune(scale: float):
        s = Strategy(beta, eta * scale)
        return s, finetune(ctx.model, ctx.theta_g, xt, yt, s, bn0, cfg.epochs, cfg.batch_size, generator(seed, 0, c),
                           cfg.client_bn)

    up, down = tune(math.exp(h)), tune(math.exp(-h))
    with torch.no_grad():
        lp = float(_val_loss(ctx.model, *_pair(up), xv, yv))
        lm = float(_val_loss(ctx.model, *_pair(down), xv, yv))
    s, ft = tune(1.0)
    with torch.no_grad():  # the same, with the client's BN statistics held at the unscaled run's (what the estimates hold)
        fp = float(_val_loss(ctx.model, up[1].params, s, ft.bn, xv, yv))
        fm = float(_val_loss(ctx.model, down[1].params, s, ft.bn, xv, yv))
    theta = {k: v.detach().requires_grad_(True) for k, v in ft.params.items()}
    lv = _val_loss(ctx.model, theta, s, ft.bn, xv, yv)
    v = torch.autograd.grad(lv, list(theta.values()))
    last = sum(float(-(a * e * g).sum()) for a, e, g in zip(v, eta, ft.last_grad))
    # with the client's statistics recomputed from theta (PreciseBN, as evaluation does), differentiably
    from fedl2p_cli.core.finetune import precise_bn_path
    lv_bn = _val_loss(ctx.model, theta, s, precise_bn_path(ctx.model, theta, xt, beta), xv, yv)
    v_bn = torch.autograd.grad(lv_bn, list(theta.values()))
    traj_bn = sum(float((a * (t - t0)).sum()) for a, t, t0 in zip(v_bn, ft.params.values(), ctx.theta_g.values()))
    traj_formula = sum(float((a * (t - t0)).sum()) for a, t, t0 in zip(v, ft.params.values(), ctx.theta_g.values()))
    # the code path: FOMAML+ with --lr-grad trajectory, its validation batch the whole validation set
    full = type(cfg)(**{**cfg.__dict__, "batch_size": max(cfg.batch_size, len(yv))})
    mg = meta_grads.builtin("fomaml", full.lr_grad).one(ctx.model, ft, lam, hyper, data, full, generator(seed, 1, c))
    code = float(mg.grads["logeta"].sum())
    full_bn = type(full)(**{**full.__dict__, "lr_grad": "trajectory-bn"})
    mg_bn = meta_grads.builtin("fomaml", "trajectory-bn").one(ctx.model, ft, lam, hyper, data, full_bn,
                                                              generator(seed, 1, c))
    code_bn = float(mg_bn.grads["logeta"].sum())
    fd = (lp - lm) / (2 * h)
    return {"client": c, "domain": ctx.part.domain_names[int(ctx.part.domain[c])], "fd": fd,
            "fd_fixed_bn": (fp - fm) / (2 * h), "last_step": last,
            "trajectory": traj_formula, "trajectory_code": code, "trajectory_bn": traj_bn, "trajectory_bn_code": code_bn}


def tensor_row(ctx, c: int, lam: dict, h: float, seed: int, names: tuple[str, ...],
               dtype: torch.dtype = torch.float32) -> dict:
    """Per tensor, at `lam`: central differences of L_V (the whole validation set, statistics recomputed after each
    fine-tuning) in log eta_k, and each LR meta-gradient's code path (log eta~'s meta-gradient)."""
    from fedl2p_cli.algorithms import meta_grads
    from fedl2p_cli.algorithms.fedl2p import hyper_fn
    from fedl2p_cli.core.finetune import Strategy, finetune
    from fedl2p_cli.engine.loop import generator
    cfg = ctx.cfg.meta
    xi, x = (_as(t, dtype) for t in ctx.inputs(c))
    hyper = hyper_fn(xi, x, len(ctx.theta_g), cfg, ctx.entries.head)
    data, bn0 = _data_as(ctx.part.client(c), dtype), ctx.stats.client_bn(c)
    bn0 = type(bn0)([_as(m, dtype) for m in bn0.mean], [_as(v, dtype) for v in bn0.var])
    (xt, yt), (xv, yv) = data.train, data.val
    with torch.no_grad():
        beta, eta = hyper(lam)

    def loss(lr: torch.Tensor) -> float:
        s = Strategy(beta, lr)
        ft = finetune(ctx.model, ctx.theta_g, xt, yt, s, bn0, cfg.epochs, cfg.batch_size, generator(seed, 0, c),
                      cfg.client_bn)
        with torch.no_grad():
            return float(_val_loss(ctx.model, ft.params, s, ft.bn, xv, yv))

    def central(step: float, k: int | None) -> float:  # k None: every LR scaled (a common scale s)
        up, down = eta.clone(), eta.clone()
        sel = slice(None) if k is None else k
        up[sel], down[sel] = eta[sel] * math.exp(step), eta[sel] * math.exp(-step)
        return (loss(up) - loss(down)) / (2 * step)

    fd = [central(h, k) for k in range(len(eta))]
    fd_fine = [central(h / 5, k) for k in range(len(eta))]  # the same at a 5x smaller step: is the slope resolved?
    common = {"fd_common": central(h, None), "fd_common_fine": central(h / 5, None)}
    ft = finetune(ctx.model, ctx.theta_g, xt, yt, Strategy(beta, eta), bn0, cfg.epochs, cfg.batch_size,
                  generator(seed, 0, c), cfg.client_bn)
    full = type(cfg)(**{**cfg.__dict__, "batch_size": max(cfg.batch_size, len(yv))})  # L_V: the whole validation set
    est = {n: meta_grads.builtin(cfg.meta_grad, n).one(ctx.model, ft, lam, hyper, data, full, generator(seed, 1, c))
           .grads["logeta"].tolist() for n in names}
    return {"client": c, "domain": ctx.part.domain_names[int(ctx.part.domain[c])], "fd": fd, "fd_fine": fd_fine} | common | est


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.to(dtype) if t.is_floating_point() else t


def _data_as(data, dtype: torch.dtype):
    """A client's tensors with every float in `dtype` (labels stay integers)."""
    return type(data)(*(tuple(_as(t, dtype) for t in b) for b in (data.train, data.val, data.test)))


def _cos(a: list[float], b: list[float]) -> float:
    return float(torch.nn.functional.cosine_similarity(torch.tensor(a), torch.tensor(b), dim=0))


def resolved(r: dict) -> bool:
    """Whether central differences resolve the client's slopes: the common scale's within x1.5 at steps h and h/5 and
    the per-tensor vectors at cosine >= 0.9 (else the loss is rough at that scale and no derivative matches it)."""
    a, b = r["fd_common"], r["fd_common_fine"]
    return a * b > 0 and 1 / 1.5 < a / b < 1.5 and _cos(r["fd"], r["fd_fine"]) >= 0.9


def _tensor_summary(rows: list[dict], names: tuple[str, ...]) -> None:
    """Per estimate, on all clients and on those whose slopes central differences resolve: within x2 of the common
    scale's finite difference, its sign right, and a per-tensor cosine >= 0.9."""
    for label, rs in (("all", rows), ("resolved", [r for r in rows if resolved(r)])):
        for n in names:
            if not rs:
                continue
            ratio = [sum(r[n]) / r["fd_common"] for r in rs]
            cos = [_cos(r[n], r["fd"]) for r in rs]
            print(f"{label:8s} {n:14s} within x2 on {sum(0.5 < x < 2 for x in ratio)}/{len(rs)}, sign right on "
                  f"{sum(x > 0 for x in ratio)}/{len(rs)}, cosine >= 0.9 on {sum(x >= 0.9 for x in cos)}/{len(rs)} "
                  f"(min {min(cos):.3f})", flush=True)


def trained(cell: str, meta_id: str, per_kind: int, h: float, names: tuple[str, ...],
            dtype: torch.dtype = torch.float32) -> list[dict]:
    """`tensor_row` for `per_kind` seen clients of each kind at the learned lambda of meta-train artifact `meta_id`;
    `dtype` float64: the model, lambda and the clients' tensors in double, so central differences resolve slopes
    that float32's rounding hides at small steps."""
    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.configs import config_from_dict
    from fedl2p_cli.stages import meta_train
    ids = search.accuracy.prerequisites(cell)
    runtime = search.accuracy.handed()
    art, lam, _ = meta_train.load_lambda(Store(search.accuracy.STORE), meta_id, runtime.catalog)
    cfg = config_from_dict(art.config)
    ctx = meta_train.make_context(str(search.accuracy.STORE), _id(ids, "pretrain"), _id(ids, "partition"),
                                  _id(ids, "stats"), cfg, runtime)
    ctx.model.to(dtype)
    ctx.theta_g = {k: _as(v, dtype) for k, v in ctx.theta_g.items()}
    lam = {k: _as(v, dtype) for k, v in lam.items()}
    seen = ctx.part.pool(False)
    picked = [c for d in range(len(ctx.part.domain_names))
              for c in [c for c in seen if int(ctx.part.domain[c]) == d][:per_kind]]
    rows = []
    for c in picked:
        r = {"cell": cell, "meta": meta_id, "dtype": str(dtype)} | tensor_row(ctx, c, lam, h, 0, names, dtype)
        rows.append(r)
        cells = "  ".join(f"{n} x{_ratio(sum(r[n]), r['fd_common'])} cos {_cos(r[n], r['fd']):.3f}" for n in names)
        print(f"{cell:16s} client {c:3d} {r['domain']:9s} FD {r['fd_common']:+.4f} (h/5: {r['fd_common_fine']:+.4f}, "
              f"{'resolved' if resolved(r) else 'rough'})  {cells}", flush=True)
    _tensor_summary(rows, names)
    return rows


def _pair(st):
    s, ft = st
    return ft.params, s, ft.bn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cells", nargs="+")
    ap.add_argument("--clients", type=int, default=4, help="seen clients per kind")
    ap.add_argument("--h", type=float, default=0.05, help="finite-difference step in log s")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--meta", default=None, help="a meta-train artifact id: per tensor, at its learned lambda (one cell)")
    ap.add_argument("--lr-grads", default="trajectory-bn,unrolled", help="--meta: the LR meta-gradients to check")
    ap.add_argument("--float64", action="store_true", help="--meta: model, lambda and data in double precision")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.meta:
        rows = trained(args.cells[0], args.meta, args.clients, args.h, tuple(args.lr_grads.split(",")),
                       torch.float64 if args.float64 else torch.float32)
        if args.json:
            with args.json.open("a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))
        return
    from fedl2p_cli.configs import MetaTrainConfig
    from fedl2p_cli.core.settings import MetaConfig
    from fedl2p_cli.stages import meta_train
    rows = []
    for cell in args.cells:
        ids = search.accuracy.prerequisites(cell)
        sec = search.accuracy.sections(cell)["meta-train"][0]
        meta = MetaConfig(head="log", lr_grad="trajectory", epochs=sec.get("epochs", 5), base_lr=sec["base_lr"],
                          batch_size=sec.get("batch_size", 32), beta_init=0.5)
        cfg = MetaTrainConfig(meta=meta, input_norm="robust")
        ctx = meta_train.make_context(str(search.accuracy.STORE), _id(ids, "pretrain"), _id(ids, "partition"),
                                      _id(ids, "stats"), cfg, search.accuracy.handed())
        seen = ctx.part.pool(False)
        picked = [c for d in range(len(ctx.part.domain_names))
                  for c in [c for c in seen if int(ctx.part.domain[c]) == d][:args.clients]]
        for c in picked:
            r = {"cell": cell} | client_row(ctx, c, meta, args.h, 0)
            rows.append(r)
            print(f"{cell:16s} client {c:3d} {r['domain']:9s} FD {r['fd']:+.4f} (BN held {r['fd_fixed_bn']:+.4f})  "
                  f"last-step {r['last_step']:+.4f} "
                  f"(x{_ratio(r['last_step'], r['fd'])})  trajectory {r['trajectory']:+.4f} "
                  f"(x{_ratio(r['trajectory'], r['fd'])})  code path {r['trajectory_code']:+.4f}  trajectory-bn "
                  f"{r['trajectory_bn']:+.4f} (x{_ratio(r['trajectory_bn'], r['fd'])}) code path "
                  f"{r['trajectory_bn_code']:+.4f}", flush=True)
    _summary(rows)
    if args.json:
        args.json.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def _summary(rows: list[dict]) -> None:
    """Per estimate: on how many clients it is within x2 of the finite difference, and agrees with its sign."""
    for key in ("last_step", "trajectory", "trajectory_bn"):
        r = [row[key] / row["fd"] for row in rows if row["fd"]]
        within = sum(0.5 < x < 2 for x in r)
        print(f"{key:14s} within x2 of the finite difference on {within}/{len(r)} clients, same sign on "
              f"{sum(x > 0 for x in r)}/{len(r)}")


def _id(ids: dict, stage: str) -> str:
    return ids[stage]


def _ratio(est: float, fd: float) -> str:
    return f"{est / fd:.2f}" if fd else "nan"


if __name__ == "__main__":
    main()
