"""Does the data ask for a per-domain beta? Three ways of choosing a beta vector from a grid, each picked on the
clients' validation splits and scored on their test splits (the same fine-tuned models):
  shared      one vector for every client (what meta-nets that ignore xi can learn),
  per domain  one vector per true domain (what meta-nets that separate the domains, ARI 1, can learn),
  per client  each client's own vector (any meta-net's bound from these levels).
Pure numpy over scores [seeds, clients, vectors, (val, test)] in percent."""

from __future__ import annotations

import numpy as np

from .text import signed

CHOICES = ("shared", "per domain", "per client")


def choose(scores: np.ndarray, groups: np.ndarray, split: int = 0) -> np.ndarray:
    """[clients, vectors, 2] -> each client's pick: per group, the vector with the best mean accuracy on `split`
    (0 validation, 1 test; ties to the earlier vector)."""
    pick = np.empty(len(groups), dtype=int)
    for g in np.unique(groups):
        m = groups == g
        pick[m] = int(np.argmax(scores[m, :, split].mean(0)))
    return pick


def groups_of(domain: np.ndarray) -> dict[str, np.ndarray]:
    return {"shared": np.zeros(len(domain), dtype=int), "per domain": domain, "per client": np.arange(len(domain))}


def test_accuracy(scores: np.ndarray, pick: np.ndarray, rows: np.ndarray | None = None) -> float:
    acc = scores[np.arange(len(pick)), pick, 1]
    return float(acc.mean() if rows is None else acc[rows].mean())


def summarize(scores: np.ndarray, domain: np.ndarray, domain_names: list[str], grid: list[tuple[float, ...]]) -> dict:
    """Per choice: test accuracy when chosen on validation and on test (the bound), mean and SD over seeds, and its
    gain over the shared vector; per domain: the vector it chose in each seed and its test accuracy."""
    gs = groups_of(domain)
    picks = {name: [(choose(s, g), choose(s, g, 1)) for s in scores] for name, g in gs.items()}  # [seed] (val, test)
    acc = {name: (np.array([test_accuracy(s, v) for s, (v, _) in zip(scores, p)]),
                  np.array([test_accuracy(s, t) for s, (_, t) in zip(scores, p)])) for name, p in picks.items()}
    shared, shared_bound = acc["shared"]
    out: dict = {"choices": {name: {"val": val.tolist(), "bound": bound.tolist(), "gain": (val - shared).tolist(),
                                    "gain_bound": (bound - shared_bound).tolist()} for name, (val, bound) in acc.items()},
                 "domains": {}}
    for d in np.unique(domain):
        rows = domain == d
        per, one = [v for v, _ in picks["per domain"]], [v for v, _ in picks["shared"]]
        out["domains"][domain_names[d]] = {
            "vector": [list(grid[p[rows][0]]) for p in per], "acc": [test_accuracy(s, p, rows) for s, p in zip(scores, per)],
            "shared_vector": [list(grid[p[0]]) for p in one], "shared_acc": [test_accuracy(s, p, rows) for s, p in zip(scores, one)]}
    return out


def markdown(summary: dict, lr: float, seeds: list[int], clients: int, vectors: int) -> str:
    f = lambda v: f"{np.mean(v):.2f} ± {np.std(v):.2f}"  # noqa: E731
    lines = [f"Test accuracy (%) of each way to choose beta, LR {lr:g}, {vectors} beta vectors, {clients} seen clients, "
             f"mean ± SD over batch-order seeds {seeds}", "",
             "| choice | chosen on validation | Δ vs shared | chosen on test (bound) | Δ vs shared (bound) |", "|---|---|---|---|---|"]
    for name, c in summary["choices"].items():
        lines.append(f"| {name} | {f(c['val'])} | {signed(np.mean(c['gain']))} ± {np.std(c['gain']):.2f} | {f(c['bound'])} "
                     f"| {signed(np.mean(c['gain_bound']))} |")
    lines += ["", "| domain | vector chosen per domain (each seed) | its test acc. | shared vector (each seed) | its test acc. |",
              "|---|---|---|---|---|"]
    vec = lambda vs: ", ".join(" / ".join(f"{b:g}" for b in v) for v in vs)  # noqa: E731
    for d, v in summary["domains"].items():
        lines.append(f"| {d} | {vec(v['vector'])} | {f(v['acc'])} | {vec(v['shared_vector'])} | {f(v['shared_acc'])} |")
    return "\n".join(lines) + "\n"
