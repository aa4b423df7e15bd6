"""Where work meets the device: the executors own it.

An executor (`rounds.in_process`, a `workers.ClientPool` in this process or in worker processes, a Flower ClientApp)
wraps the context its updates read in `OnDevice(context, runtime's device)`: the context is placed on the device once
per process, each task's tensors are moved there, and the update's result comes back to the host once. Stage code
never moves a tensor: its updates follow their inputs' device, as core/ does. On the CPU nothing is copied.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

import torch

from ..device import move, to_host


def place(obj: Any, dev: torch.device) -> Any:
    """A context on `dev` (`device.move` with `place`: the one walk over containers). The CPU: `obj` itself."""
    return obj if dev.type == "cpu" else move(obj, dev, place=True)


def placed(context: Any, dev: torch.device) -> OnDevice:
    """`context` placed on `dev`, unless a builder placed it already (`workers.on_runtime`: on its own runtime's)."""
    return context if isinstance(context, OnDevice) else OnDevice(context, dev)


class OnDevice:
    """A context placed on `dev`; `self(update, task)` is `update(context, task)` with the task's tensors on `dev` and
    the result's back on the host. A dict that a round's tasks share in one field (the broadcast state) is moved once
    per process however many of its clients run here."""

    def __init__(self, context: Any, dev: torch.device):
        self.dev = torch.device(dev)
        self.context = place(context, self.dev)
        self._shared: dict[str, tuple[Any, Any]] = {}  # field -> its last dict (held: its id cannot be reused), copy

    def __call__(self, update: Callable[[Any, Any], Any], task: Any) -> Any:
        return to_host(update(self.context, self.move(task)))

    def many(self, update_many: Callable[[Any, list[Any]], list[Any]], tasks: list[Any]) -> list[Any]:
        """`update_many(context, tasks)` with every task on `dev`, the results back on the host."""
        return cast(list[Any], to_host(update_many(self.context, [self.move(t) for t in tasks])))

    def move(self, task: Any) -> Any:
        if self.dev.type == "cpu":
            return task
        if dataclasses.is_dataclass(task) and not isinstance(task, type):
            return dataclasses.replace(task, **{f.name: self._field(f.name, getattr(task, f.name))
                                                for f in dataclasses.fields(task) if f.init})
        return self._field("", task)

    def _field(self, name: str, value: Any) -> Any:
        if not isinstance(value, dict):
            return move(value, self.dev)
        if self._shared.get(name, (None,))[0] is not value:
            self._shared[name] = (value, move(value, self.dev))
        return self._shared[name][1]
