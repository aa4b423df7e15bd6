"""In-process federated execution helpers: per-(round, client) seeding, client sampling, round checkpoints.

Every random draw of round t for client c comes from a generator seeded by (seed, t, c), so a resumed
run replays exactly what an uninterrupted one would have done.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..io import weights


def generator(seed: int, *keys: int) -> torch.Generator:
    """A fresh CPU generator seeded by (seed, *keys): every random draw of round t for client c comes from
    generator(seed, t, c) (resume and worker processes draw the same)."""
    mixed = np.random.SeedSequence([seed, *keys]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(mixed) & ((1 << 63) - 1))


BATCH_STREAM = 7  # the key of the personalisation batch stream: generator(seed, client, BATCH_STREAM)


def batch_stream(seed: int, client: int) -> torch.Generator:
    """The batch order of every personalisation of `client` with personalisation seed `seed` (a fresh generator each
    call): every method, system and analysis of a client and seed draws from it, so their accuracies are paired."""
    return generator(seed, client, BATCH_STREAM)


def sample_clients(pool: list[int], fraction: float, seed: int, rnd: int, attempt: int = 0) -> list[int]:
    """ceil-free C*r sampling (at least one client), without replacement, sorted for readability. `attempt` > 0:
    the fresh sample of a retried round."""
    k = max(1, int(round(fraction * len(pool))))
    rng = np.random.default_rng([seed, rnd, 104729] + ([attempt] if attempt else []))
    return sorted(int(c) for c in rng.choice(pool, size=min(k, len(pool)), replace=False))


def step_lr(base: float, rnd: int, rounds: int, milestones: tuple[float, ...] = (0.5, 0.75), gamma: float = 0.1) -> float:
    """The paper's schedule: x0.1 at 50% and 75% of the rounds (rnd counts from 0)."""
    return base * gamma ** sum(rnd >= int(m * rounds) for m in milestones)


def nest(group: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` as group `group` of a flat state (keys "group.name"): the one encoding of nested state
    (lambda, best lambda, optimiser moments, per-client tensors) in checkpoints and artifacts."""
    return {f"{group}.{k}": v for k, v in tensors.items()}


def group_of(flat: dict[str, torch.Tensor], group: str) -> dict[str, torch.Tensor]:
    """Group `group` of a flat state, with its prefix removed (empty if absent)."""
    p = group + "."
    return {k[len(p):]: v for k, v in flat.items() if k.startswith(p)}


@dataclass
class LoopState:
    """The server state between rounds: the next round, the tensors (flat, `nest`/`group_of` for groups), the
    history rows so far and any JSON-able extra state; what a round checkpoint holds."""
    next_round: int
    tensors: dict[str, torch.Tensor]
    history: list[dict] = field(default_factory=list)
    extra: dict = field(default_factory=dict)


class Checkpoint:
    """Round checkpoints in a work folder: ONE safetensors file holding the tensors and, in its metadata, the
    round counter, history and extra state, written beside and published by one os.replace. A kill at any
    moment leaves either the previous checkpoint or the new one, never tensors of one round paired with the
    bookkeeping of another."""

    NAME = "checkpoint.safetensors"

    def __init__(self, folder: Path):
        self.folder = folder

    def save(self, st: LoopState) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        weights.save(self.folder / self.NAME, st.tensors,
                     {"next_round": st.next_round, "history": st.history, "extra": st.extra, "order": list(st.tensors)})

    def load(self) -> LoopState | None:
        for part in self.folder.glob("*.part"):  # a write cut by a kill (the caller holds the artifact's lock)
            part.unlink(missing_ok=True)
        path = self.folder / self.NAME
        if not path.is_file():
            return None
        tensors, meta = weights.load_with_meta(path)
        # the saved key order (safetensors returns keys sorted): float sums over dicts (the meta-gradient norms that
        # history.csv reports) then add in the same order as an uninterrupted run, and resume is bit-identical
        order = meta.get("order", list(tensors))
        return LoopState(meta["next_round"], {k: tensors[k] for k in order}, meta["history"], meta["extra"])

    def clear(self) -> None:
        (self.folder / self.NAME).unlink(missing_ok=True)
