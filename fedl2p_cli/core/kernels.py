"""Whether the custom autograd nodes (core.conv's convolution, core.pool's max-pool) may run: inside torch.func's
transforms (vmap, grad) an autograd.Function without a vmap rule cannot, so the batched path (core.batched) runs the
same functions through torch's own kernels. The values are the same functions; only the kernels differ."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_PLAIN: ContextVar[bool] = ContextVar("plain_kernels", default=False)


@contextmanager
def plain() -> Iterator[None]:
    """Within it, core.conv.Conv2d and core.pool.MaxPool2d compute as nn.Conv2d and nn.MaxPool2d."""
    token = _PLAIN.set(True)
    try:
        yield
    finally:
        _PLAIN.reset(token)


def custom_allowed() -> bool:
    return not _PLAIN.get()
