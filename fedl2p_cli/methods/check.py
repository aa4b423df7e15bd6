"""What a hand-made method fine-tunes, checked against the model it gets: a method naming a tensor the model lacks,
or naming none, would run and print a normal row while fine-tuning nothing it meant to (issue 51)."""

from __future__ import annotations

from typing import Any

from ..catalog import METHOD, Catalog
from ..errors import FedL2PError


def _who(name: str, catalog: Catalog | None) -> str:
    """The method's name and, for a plugin's, the plugin, as `catalog` (the one the method was looked up in; None:
    not handed, the name alone) records it. Never the context's catalog: it may not be the one the method came from."""
    p = None if catalog is None else catalog.owner(METHOD, name)
    return f"method '{name}'" + ("" if p is None or p.builtin else f" from {p.describe()}")


def tensors(method: Any, model: Any, catalog: Catalog | None) -> set[str]:
    """The parameter names `method.tensors(model)` chooses, each one of `model`'s (after the BN swap: what the method
    receives), at least one; else one line listing the model's tensor names (and naming the method's plugin in
    `catalog`)."""
    have = [n for n, _ in model.named_parameters()]
    try:
        chosen = method.tensors(model)
        chosen = {chosen} if isinstance(chosen, str) else set(chosen)
    except Exception as e:  # noqa: BLE001 - the method's own code: one line naming it
        raise FedL2PError(f"{_who(method.name, catalog)}: tensors(model) raised {e.__class__.__name__}: {e}") from None
    names = ", ".join(have)
    unknown = sorted(str(n) for n in chosen if n not in have)
    if unknown:
        raise FedL2PError(f"{_who(method.name, catalog)}: tensors(model) names '{unknown[0]}', which the model does not have; "
                          f"its tensors (after the BN swap): {names}")
    if not chosen:
        raise FedL2PError(f"{_who(method.name, catalog)}: tensors(model) names no tensor, so it would fine-tune nothing; the "
                          f"model's tensors (after the BN swap): {names}")
    return chosen


def rate(method: Any, catalog: Catalog | None) -> None:
    """A learning-rate factor that fine-tunes something (0 or less: nothing, or against the gradient)."""
    if not method.lr_factor > 0:
        raise FedL2PError(f"{_who(method.name, catalog)}: lr_factor {method.lr_factor!r} fine-tunes nothing; it must be > 0")
