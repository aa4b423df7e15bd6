"""`make bench-reference REF=PATH`: the authors' FedL2P client (royson/fedl2p) beside `fedl2p meta-train`, on one cell.

The authors' side runs their own code, imported from the clone at --ref: their `FedL2PClassificationClient.fit()`
(learn2learn's clone/update, their `Hypergrad` with psi 0.1 and Q 3, meta-LRs 1e-3 / 1e-3 / 1e-4, gradient clamp 1,
learnable per-tensor LRs, their configs' BNNet and LR-net) and `evaluate()` (e epochs of fine-tuning with the learned
LRs and beta). What is ours: the cell's partition, the pretrained model (our weights in their KLD batch-norm layers;
the logits are compared), the clients each round samples (our sampler and seed), and the server: their FedAvg's
average weighted by validation size, the lambda kept after the round with the lowest validation loss.
Their `outer_loop_epochs` is set to our K: it counts epochs over a client's validation batches, so their clients take
K x ceil(|val| / 32) meta-steps where ours take K (printed).

Our side: the cell's pipeline file cut to its stable-IFT meta-train runs (3 seeds), built or reused in the store,
personalised with the cell's hand-made methods on both pools; its beta per domain, eta~'s growth and accuracy.

Writes bench/reference.md and bench/reference.json. Runs in .venv-ref (scripts/reference-venv.sh builds it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from refclient import Shared, client_kwargs, fail, import_reference, logit_gap, reference_config, their_model  # noqa: E402

from fedl2p_cli.analysis import tables  # noqa: E402

STORE = Path(os.environ.get("FEDL2P_STORE", HERE.parent / "artifacts"))
PSEEDS = [0, 1, 2]  # personalisation seeds, as in the bench


# --- the authors' federation --------------------------------------------------------------------------------------

def params_mean(replies):
    """Their FedAvg: the mean of the meta-net parameters weighted by each client's validation size."""
    total = sum(n for _, n, _ in replies)
    return [sum(p[i] * (n / total) for p, n, _ in replies) for i in range(len(replies[0][0]))]


def run_reference(client_mod, config, kwargs: dict, seen: list[int], cfg: dict, seed: int, log) -> dict:
    import numpy as np
    import torch

    from fedl2p_cli.engine.loop import sample_clients
    rounds, n_eta = config.app.run.num_rounds, None
    make = lambda c: client_mod.FedL2PClassificationClient(str(c), type("Ckp", (), {"config": config})(), **kwargs)
    torch.manual_seed(seed)
    params = make(seen[0]).get_parameters()
    n_eta = make(seen[0]).no_of_learnable_layers
    eta0 = np.array([float(np.ravel(p)[0]) for p in params[-n_eta:]])
    best, history = (float("inf"), 0, params), []
    for rnd in range(rounds):
        replies = []
        for c in sample_clients(seen, cfg["fraction"], seed, rnd):
            torch.manual_seed(seed * 100003 + rnd * 1009 + c)  # each client's batch order, reproducibly
            cl = make(c)
            p, n, res = cl.fit(params, {"current_round": rnd + 1, "inner_lr": cfg["base_lr"], "bn_net_lr": 1e-3,
                                        "lr_net_lr": 1e-3}, num_workers=0)
            replies.append((p, n, res))
        loss = sum(r["fed_query_loss"] * n for _, n, r in replies) / sum(n for _, n, _ in replies)
        params = params_mean(replies)
        eta = np.array([float(np.ravel(p)[0]) for p in params[-n_eta:]]) / eta0
        history.append({"round": rnd + 1, "val_loss": loss, "eta_x": float(eta.mean()), "eta_min": float(eta.min()),
                        "eta_max": float(eta.max()), "finite": bool(np.isfinite(loss))})
        if np.isfinite(loss) and loss < best[0]:
            best = (loss, rnd + 1, params)
        log(f"  authors' code, seed {seed}, round {rnd + 1}/{rounds}: val {loss:.4f}, eta~ x{eta.mean():.3g} "
            f"({eta.min():.3g}-{eta.max():.3g})")
    steps = client_mod.epochs_to_batches(cfg["iterations"], len(Shared.part.client(seen[0]).val[1]), cfg["batch_size"])
    return {"history": history, "kept_round": best[1], "kept": best[2], "meta_steps_first_client": steps}


def evaluate_reference(client_mod, config, kwargs: dict, params, clients: list[int], cfg: dict) -> dict:
    """Their evaluate() on each client at personalisation seeds PSEEDS: test accuracy after e epochs and beta."""
    import numpy as np
    import torch
    acc, betas = np.zeros((len(PSEEDS), len(clients))), {}
    rc = {"current_round": config.app.run.num_rounds, "standard_learning": False, "full_eval": True,
          "finetune_epochs": [cfg["epochs"]], "eval_epochs": [cfg["epochs"]], "lr": cfg["base_lr"]}
    for s, ps in enumerate(PSEEDS):
        for j, c in enumerate(clients):
            torch.manual_seed(ps * 100003 + c)
            cl = client_mod.FedL2PClassificationClient(str(c), type("Ckp", (), {"config": config})(), **kwargs)
            _, _, m = cl.evaluate(params, rc, num_workers=0)
            acc[s, j] = m[f"test_acc_{cfg['epochs']}:"]
            betas[c] = [m[k] for k in sorted(k for k in m if k.startswith("layer") and k.endswith("_beta"))]
    return {"acc": acc, "beta": betas}


# --- our side ---------------------------------------------------------------------------------------------------------

def ours(cell: str) -> dict:
    """Build or reuse the cell's stable-IFT meta-train runs and their personalisation; read what the table shows."""
    import accuracy
    import numpy as np

    from fedl2p_cli.cli.render import RichProgress
    from fedl2p_cli.stages import personalize as pers_stage
    from fedl2p_cli.stages import pipeline
    s = accuracy.sections(cell, stable_ift=True)
    res = pipeline.run(pipeline.Pipeline(f"reference-{cell}", s, pipeline.Store(STORE)), None, RichProgress,
                       runtime=accuracy.handed())
    store = pipeline.Store(STORE)
    out = {"pools": {}}
    for r in res:
        if r.stage == "personalize":  # each pool's personalisation has the same meta-train parents
            out["meta"] = accuracy.meta_runs(r.artifact.id)
            _, x = pers_stage.load(store, r.artifact.id)
            learned = pers_stage.learned_rows(r.artifact, x)
            acc = {m: x.acc_after[x.methods.index(m)].mean(axis=1) for m in x.methods}  # per seed: the pool mean
            beta = np.stack([x.beta[m] for m in learned])  # [meta seeds, clients, B]
            out["pools"][x.pool] = {"acc": {m: acc[m].tolist() for m in x.methods}, "learned": learned,
                                    "beta": beta, "domain": x.domain, "client": x.client}
            out["partition"] = r.artifact.parents["partition"]
            out["pretrain"] = r.artifact.parents["pretrain"]
    return out


# --- the report -------------------------------------------------------------------------------------------------------

def beta_by_domain(beta, domains, names) -> dict[str, str]:
    import numpy as np
    return {names[d]: "/".join(f"{v:.2f}" for v in np.nanmean(beta[..., np.asarray(domains) == d, :].reshape(-1, beta.shape[-1]), axis=0))
            for d in sorted(set(int(v) for v in domains))}


def pm(vals) -> str:
    import numpy as np
    v = 100 * np.asarray(vals, dtype=float)
    return f"{v.mean():.2f} ± {v.std():.2f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", type=Path, required=True, help="a clone of the authors' repository (royson/fedl2p)")
    ap.add_argument("--cell", default="planted", help="the bench cell (bench/accuracy.py's cells); default planted")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="meta-train seeds of the authors' side")
    a = ap.parse_args(argv)
    client_mod, model_utils = import_reference(a.ref.resolve())
    import torch
    torch.set_num_threads(1)
    import accuracy
    if a.cell not in accuracy.CELLS:
        fail(f"--cell {a.cell}: choose one of {', '.join(accuracy.CELLS)}")
    t0 = time.time()
    print(f"[ours] {a.cell}: stable-IFT meta-train (3 seeds) and personalisation, built or reused in {STORE}", flush=True)
    our = ours(a.cell)
    cfg = accuracy.sections(a.cell, stable_ift=True)["meta-train"][0]
    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.stages import partition as partition_stage
    from fedl2p_cli.stages import pretrain as pretrain_stage
    store = Store(STORE)
    _, part = partition_stage.load(store, our["partition"])
    _, model, state = pretrain_stage.load(store, our["pretrain"])
    Shared.part, Shared.template = part, their_model(model, model_utils)
    weights = HERE / ".reference-weights.pt"
    torch.save({k: v.clone() for k, v in state.items()}, weights)
    seen, unseen = part.pool(False), part.pool(True)
    gap = logit_gap(model, state, client_mod, model_utils, part.client(seen[0]).test[0][:64])
    print(f"[reference] our pretrained model in their KLD batch norm: max |logit difference| {gap:.2g}", flush=True)
    rounds = int(cfg["rounds"])
    config, kwargs = reference_config(cfg, rounds, weights), client_kwargs(cfg, rounds)
    theirs = []
    for seed in a.seeds:
        print(f"[reference] authors' client, meta-train seed {seed}: {rounds} rounds", flush=True)
        run = run_reference(client_mod, config, kwargs, seen, cfg, seed, lambda m: print(m, flush=True))
        ev = {pool: evaluate_reference(client_mod, config, kwargs, run["kept"], cl, cfg)
              for pool, cl in (("seen", seen), ("unseen", unseen))}
        theirs.append((run, ev))
    weights.unlink(missing_ok=True)
    names = part.domain_names
    report = render(a, cfg, our, theirs, names, part, gap, time.time() - t0)
    (HERE / "reference.md").write_text(report)
    print(report)


def render(a, cfg: dict, our: dict, theirs: list, names: list[str], part, gap: float, secs: float) -> str:
    import numpy as np
    pools = ("seen", "unseen")
    lines = [f"# bench-reference: the authors' FedL2P client beside `fedl2p meta-train` (cell {a.cell})", "",
             f"Max |logit difference| of the pretrained model in their batch norm: {gap:.2g}. "
             f"Their clients' meta-steps per round (first seen client): {theirs[0][0]['meta_steps_first_client']}; "
             f"ours: K = {cfg['iterations']}.", ""]
    doms = sorted(set(int(d) for d in part.domain))
    cols = ["", *(f"β {names[d]} (per BN layer)" for d in doms), "η̃ after the last round (× start)", "end", "kept round",
            *(f"{p} acc. (%)" for p in pools)]
    # the authors' side
    th_beta = {}
    for p in pools:
        b = np.stack([np.array([ev[p]["beta"][c] for c in (part.pool(p == "unseen"))]) for _, ev in theirs])
        th_beta[p] = b
    seen_dom = part.domain[part.pool(False)]
    tb = beta_by_domain(th_beta["seen"], seen_dom, names)
    eta = [r["history"][-1]["eta_x"] for r, _ in theirs]
    ends = ["stable" if all(h["finite"] for h in r["history"]) else "NaN" for r, _ in theirs]
    acc = {p: [ev[p]["acc"].mean() for _, ev in theirs] for p in pools}
    rows = [["authors' code (IFT)", *(tb.get(names[d], "–") for d in doms), " / ".join(f"{e:.2f}" for e in eta),
             " / ".join(ends), " / ".join(str(r["kept_round"]) for r, _ in theirs), *(pm(acc[p]) for p in pools)]]
    ob = beta_by_domain(our["pools"]["seen"]["beta"], our["pools"]["seen"]["domain"], names)
    om = our["meta"]
    oacc = {p: [np.mean(our["pools"][p]["acc"][m]) for m in our["pools"][p]["learned"]] for p in pools}
    rows.append(["`fedl2p meta-train` (defaults)", *(ob.get(names[d], "–") for d in doms),
                 " / ".join(f"{m['eta_last']:.2f}" for m in om), " / ".join("diverged" if m["diverged"] else "stable" for m in om),
                 " / ".join(str(m["kept_round"]) for m in om), *(pm(oacc[p]) for p in pools)])
    rows += [[f"{m} (same clients, ours)", *("" for _ in doms), "", "", "", *(pm(our["pools"][p]["acc"][m]) for p in pools)]
             for m in ("ft-bnc", "ft-bng", "ft-bni", "ft-tuned") if m in our["pools"]["seen"]["acc"]]
    lines += tables.lines(cols, rows)
    lines += ["", "β: mean over the seen clients of each domain and the meta-train seeds. η̃ and kept round: per "
              "meta-train seed. Accuracy: mean ± SD over meta-train seeds of the mean over personalisation seeds "
              "(hand-made rows: over personalisation seeds).", f"Run time: {secs / 60:.0f} min.", ""]
    with open(HERE / "reference.json", "w") as f:
        json.dump({"cell": a.cell, "gap": gap, "theirs": [{"history": r["history"], "kept_round": r["kept_round"],
                   "acc": {p: ev[p]["acc"].tolist() for p in pools},
                   "beta": {p: {str(c): v for c, v in ev[p]["beta"].items()} for p in pools}}
                   for r, ev in theirs], "ours": {"meta": om, "acc": {p: our["pools"][p]["acc"] for p in pools}}},
                  f, indent=1)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
