"""Two ways to differentiate one client's computation, with torch.func's signatures (`grad`, `grad_and_value`, `vjp`).

A client's meta-gradient is written once, as a function of that client's tensors, in terms of one of these:
`FUNC` is torch.func itself, which `vmap` batches over a group of clients (`core.batched`); `AUTOGRAD` computes the
same derivatives by `torch.autograd.grad` on one client's graph. They give the same values; `AUTOGRAD` runs the
custom autograd nodes (core.conv, core.bn's MixedBatchNorm) without torch.func's per-op wrapping, which on a small
model costs ~1.4x the hypergradient on one CPU thread (measured on small-cnn, AMD EPYC, AVX512).

In `AUTOGRAD` a transform nested in another builds its graph (create_graph), so that the outer one differentiates
it, as torch.func's levels do; the outermost does not. Arguments that do not require grad are differentiated as
fresh leaves: a value that depends on no outer argument is a constant to the outer transforms, as in torch.func.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_unflatten

_DEPTH: ContextVar[int] = ContextVar("autodiff_depth", default=0)


@contextmanager
def _inside() -> Iterator[None]:
    token = _DEPTH.set(_DEPTH.get() + 1)
    try:
        yield
    finally:
        _DEPTH.reset(token)


def _tracked(tree: Any) -> tuple[Any, list[Tensor], Any]:
    leaves, spec = tree_flatten(tree)
    tracked = [t if t.requires_grad else t.detach().requires_grad_(True) for t in leaves]
    return tree_unflatten(tracked, spec), tracked, spec


def _grads(out: Tensor | list[Tensor], inputs: list[Tensor], cotangents: list[Tensor] | None = None,
           again: bool = False) -> list[Tensor]:
    """d out / d inputs; `again`: the graph is kept for more products (a vjp's), as it is inside another transform."""
    if not inputs or not any(o.requires_grad for o in (out if isinstance(out, list) else [out])):
        return [torch.zeros_like(i) for i in inputs]
    nested = _DEPTH.get() > 0
    gs = torch.autograd.grad(out, inputs, cotangents, retain_graph=again or nested, create_graph=nested,
                             allow_unused=True)
    return [torch.zeros_like(i) if g is None else g for g, i in zip(gs, inputs)]


def _argnums(argnums: int | tuple[int, ...]) -> tuple[int, ...]:
    return (argnums,) if isinstance(argnums, int) else argnums


def grad_and_value(fn: Callable, argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> Callable:
    """torch.func.grad_and_value by torch.autograd.grad."""
    def run(*args: Any) -> tuple[Any, Any]:
        at = list(args)
        specs = {}
        for i in _argnums(argnums):
            at[i], flat, spec = _tracked(at[i])
            specs[i] = (flat, spec)
        with _inside():
            res = fn(*at)
        out, aux = res if has_aux else (res, None)
        flat_all = [t for i in _argnums(argnums) for t in specs[i][0]]
        gs = iter(_grads(out, flat_all))
        grads = tuple(tree_unflatten([next(gs) for _ in specs[i][0]], specs[i][1]) for i in _argnums(argnums))
        g = grads[0] if isinstance(argnums, int) else grads
        return g, ((out, aux) if has_aux else out)
    return run


def grad(fn: Callable, argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> Callable:
    """torch.func.grad by torch.autograd.grad."""
    def run(*args: Any) -> Any:
        g, val = grad_and_value(fn, argnums, has_aux)(*args)
        return (g, val[1]) if has_aux else g
    return run


def vjp(fn: Callable, *primals: Any, has_aux: bool = False) -> tuple[Any, ...]:
    """torch.func.vjp by torch.autograd.grad: the function's output (a pytree) and its vector-Jacobian product, which
    may be called many times (the graph is kept). `vjp_fn(cotangent, only=i)` computes the product for primal i alone
    (the others None): autograd then walks only that part of the graph."""
    tracked = [_tracked(p) for p in primals]
    with _inside():
        res = fn(*(t[0] for t in tracked))
    out, aux = res if has_aux else (res, None)
    outs = tree_flatten(out)[0]

    def vjp_fn(cotangent: Any, only: int | None = None) -> tuple[Any, ...]:
        cots = tree_flatten(cotangent)[0]
        keep = [(o, c) for o, c in zip(outs, cots) if o.requires_grad]
        which = range(len(tracked)) if only is None else [only]
        inputs = [t for i in which for t in tracked[i][1]]
        gs = iter(_grads([o for o, _ in keep], inputs, [c for _, c in keep], again=True))
        return tuple(tree_unflatten([next(gs) for _ in flat], spec) if i in which else None
                     for i, (_, flat, spec) in enumerate(tracked))
    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)


def _func_vjp(fn: Callable, *primals: Any, has_aux: bool = False) -> tuple[Any, ...]:
    """torch.func.vjp whose product takes `only` as `vjp` does (it computes every primal's product regardless)."""
    res = torch.func.vjp(fn, *primals, has_aux=has_aux)
    full = res[1]

    def vjp_fn(cotangent: Any, only: int | None = None) -> tuple[Any, ...]:
        out = full(cotangent)
        return out if only is None else tuple(o if i == only else None for i, o in enumerate(out))
    return (res[0], vjp_fn, *res[2:])


@dataclass(frozen=True)
class Transforms:
    """A set of the transforms: `AUTOGRAD` (one client) or `FUNC` (torch.func, vmappable). `nested()` marks a
    region whose gradients a caller differentiates further (`AUTOGRAD` then builds their graphs; torch.func always)."""
    grad: Callable
    grad_and_value: Callable
    vjp: Callable
    nested: Callable[[], AbstractContextManager]


AUTOGRAD = Transforms(grad, grad_and_value, vjp, _inside)
FUNC = Transforms(torch.func.grad, torch.func.grad_and_value, _func_vjp, nullcontext)
