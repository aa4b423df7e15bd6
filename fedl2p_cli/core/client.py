"""What a client update receives and how it reports time: plain containers, no I/O (algorithms/ import only core/)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(kw_only=True)
class LocalConfig:
    """A client's local training: epochs, batch size, and the classifier (`head` prefix) FedBABU keeps fixed."""
    epochs: int = 1
    batch_size: int = 32
    head: str = ""            # parameter-name prefix of the classifier
    freeze_head: bool = False  # FedBABU
    pf_alpha: float = 0.01     # Per-FedAvg inner step size (alpha in Fallah et al.)


@dataclass
class ClientData:
    """One client's normalised tensors."""

    train: Batch
    val: Batch
    test: Batch

    @property
    def n_train(self) -> int:
        return int(self.train[1].numel())


class Timer:
    """Accumulates named wall-clock sections (for the round time split)."""

    def __init__(self) -> None:
        self.t: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.t[name] = self.t.get(name, 0.0) + seconds

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)
