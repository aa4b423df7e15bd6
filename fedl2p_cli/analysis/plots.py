"""PNG figures for the stages (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def label_mix_heatmap(hist: np.ndarray, domain: np.ndarray, domain_names: list[str], classes: list[str], path: Path) -> None:
    """Clients (rows, grouped by domain) x classes, share of each class in the client's data."""
    order = np.argsort(domain, kind="stable")
    share = hist[order] / np.maximum(hist[order].sum(1, keepdims=True), 1)
    fig, ax = plt.subplots(figsize=(7, max(3, min(12, len(order) * 0.06))))
    im = ax.imshow(share, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_xticks(range(len(classes)), classes, rotation=60, ha="right", fontsize=7)
    bounds = np.cumsum(np.bincount(domain[order], minlength=len(domain_names)))
    for b in bounds[:-1]:
        ax.axhline(b - 0.5, color="white", lw=0.8)
    ax.set_yticks([(a + b) / 2 for a, b in zip(np.r_[0, bounds[:-1]], bounds)], domain_names, fontsize=7)
    ax.set_title("label mix per client (rows grouped by domain)")
    fig.colorbar(im, ax=ax, label="share of client's samples")
    _save(fig, path)


def pretrain_curves(history: list[dict], algo: str, path: Path) -> None:
    fig, ax1 = plt.subplots(figsize=(6, 3.5))
    r = [h["round"] for h in history]
    ax1.plot(r, [h["train_loss"] for h in history], color="tab:gray", label="train loss")
    ax1.set_xlabel("round")
    ax1.set_ylabel("train loss")
    ax2 = ax1.twinx()
    for pool, color in (("seen", "tab:blue"), ("unseen", "tab:orange")):
        pts = [(h["round"], h[f"{pool}_acc"]) for h in history if f"{pool}_acc" in h]
        if pts:
            ax2.plot(*zip(*pts), marker="o", color=color, label=f"{pool} test acc")
    ax2.set_ylabel("global accuracy")
    fig.legend(loc="lower center", ncol=3, fontsize=8)
    ax1.set_title(f"pretraining ({algo})")
    _save(fig, path)


def meta_curves(history: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    r = [h["round"] for h in history]
    ax.plot(r, [h["val_loss"] for h in history], label="mean val loss (after fine-tuning)")
    ax.plot(r, [h["train_loss"] for h in history], label="mean fine-tuning loss", alpha=0.6)
    ax.set_xlabel("round")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    ax.set_title("meta-training")
    _save(fig, path)


def hyperparam_boxes(values: np.ndarray, labels: list[str], title: str, ylabel: str, path: Path, log: bool = False) -> None:
    """Fig. 2 style: per layer, the distribution across clients (locality, spread, skew)."""
    fig, ax = plt.subplots(figsize=(max(5, len(labels) * 0.35), 3.5))
    ax.boxplot(values, showfliers=True)
    ax.set_xticks(range(1, len(labels) + 1), labels, rotation=70, ha="right", fontsize=6)
    if log:
        ax.set_yscale("symlog", linthresh=1e-5)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _save(fig, path)


def bar(values: dict[str, float], title: str, ylabel: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(max(4, len(values) * 0.5), 3.2))
    ax.bar(list(values), list(values.values()), color="tab:blue")
    ax.set_xticks(range(len(values)), list(values), rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    _save(fig, path)


def plot_distance_map(m: np.ndarray, names: list[str], title: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(1.2 + 0.55 * len(names), 1.0 + 0.5 * len(names)))
    lim = max(float(np.nanmax(np.abs(m))), 1e-6)
    im = ax.imshow(m, cmap="coolwarm", vmin=-lim, vmax=lim)
    ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    for i in range(len(names)):
        for j in range(len(names)):
            ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=6)
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax)
    _save(fig, path)


def learning_curves(history: list[dict], domains: list[str], path: Path) -> None:
    """Is lambda learning, and what? Validation loss; beta per domain (colour) and BN layer (line style) as lambda
    hands it to every seen client; mean eta per layer group; meta-gradient norm per block before clipping."""
    r = [h["round"] for h in history]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    ax = axes[0, 0]
    ax.plot(r, [h["val_loss"] for h in history], label="mean val loss")
    ax.plot(r, [h["train_loss"] for h in history], label="mean fine-tuning loss", alpha=0.6)
    ax.set_title("losses of the sampled clients")
    ax.legend(fontsize=7)
    ax = axes[0, 1]
    styles = ["-", "--", ":", "-."]
    colors = plt.get_cmap("tab10")
    for d, name in enumerate(domains):
        layers = sorted(int(k.rsplit("_", 1)[1]) for k in history[0] if k.startswith(f"beta_{name}_"))
        for j, b in enumerate(layers[:4] if len(layers) <= 4 else layers[::max(1, len(layers) // 4)][:4]):
            ax.plot(r, [h[f"beta_{name}_{b}"] for h in history], color=colors(d % 10), ls=styles[j % 4],
                    label=f"{name}" if j == 0 else None, lw=1.2)
    ax.set_title("beta per domain (line style: BN layer)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=6, ncol=2)
    ax = axes[1, 0]
    groups = [k for k in history[-1] if k.startswith("etagroup_")]
    for k in groups[:12]:
        ax.plot(r, [h.get(k, np.nan) for h in history], label=k[9:], lw=1)
    if any(float(h.get(k, 0)) > 0 for k in groups for h in history):  # every LR frozen at 0: no log axis to draw
        ax.set_yscale("log")
    ax.set_title("mean learning rate per layer group")
    ax.legend(fontsize=6, ncol=3)
    ax = axes[1, 1]
    for blk in ("bnnet", "lrnet", "eta"):
        if f"gnorm_{blk}" in history[0]:
            clipped = np.mean([h[f"clipped_{blk}"] for h in history])
            ax.plot(r, [h[f"gnorm_{blk}"] for h in history], label=f"{blk} (clipped {100 * clipped:.1f}% of entries)")
    ax.set_yscale("log")
    ax.set_title("meta-gradient norm per block, before clipping")
    ax.legend(fontsize=7)
    for a in axes.flat:
        a.set_xlabel("round")
    _save(fig, path)
