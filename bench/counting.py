"""Counting the backward passes a function makes, by wrapping `torch.autograd.grad` (independent of the code counted).

A call is a *second-order product* (a Hessian-vector or mixed product) when the graph it back-propagates through
contains a gradient that an earlier call returned with `create_graph=True` (the IFT's products with dL_T/dtheta,
FOMAML+'s backward through its in-graph step); any other call is a *first-order gradient*. `loss.backward()` (through
`torch.autograd.backward`) counts the same way; a module that bound `grad` at import (`from torch.autograd import
grad`, as the authors' client does) is named in `modules` so that its calls are counted too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


@dataclass
class Counts:
    first_order: int = 0
    second_order: int = 0
    _nodes: set = field(default_factory=set, repr=False)  # graph nodes of gradients made with create_graph=True
    _keep: list = field(default_factory=list, repr=False)  # those gradients, alive while counting (stable nodes)

    def through_a_gradient(self, outputs) -> bool:
        todo = [o.grad_fn for o in ([outputs] if isinstance(outputs, torch.Tensor) else outputs)]
        seen = set()
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            if node in self._nodes:
                return True
            seen.add(node)
            todo.extend(n for n, _ in node.next_functions)
        return False


    def count(self, outputs) -> None:
        if self.through_a_gradient(outputs):
            self.second_order += 1
        else:
            self.first_order += 1


@contextmanager
def count_backward(modules: tuple = ()) -> Iterator[Counts]:
    counts, original, original_backward = Counts(), torch.autograd.grad, torch.autograd.backward

    def grad(outputs, inputs, *args, **kwargs):
        counts.count(outputs)
        result = original(outputs, inputs, *args, **kwargs)
        if kwargs.get("create_graph"):
            made = [r for r in result if r is not None and r.grad_fn is not None]
            counts._keep.extend(made)
            counts._nodes.update(r.grad_fn for r in made)
        return result

    def backward(tensors, *args, **kwargs):
        counts.count(tensors)
        return original_backward(tensors, *args, **kwargs)

    bound = [m for m in modules if getattr(m, "grad", None) is original]
    torch.autograd.grad, torch.autograd.backward = grad, backward
    for m in bound:
        m.grad = grad
    try:
        yield counts
    finally:
        torch.autograd.grad, torch.autograd.backward = original, original_backward
        for m in bound:
            m.grad = original
