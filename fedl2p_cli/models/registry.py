"""Models by name: the registered ones (built-ins and plugins' `add_model`) or any `package.module:factory`. Every
BatchNorm1d/2d of a model becomes a `MixBN` (models/bn_swap.py), so all BN strategies share one code path."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import torch
from torch import nn

from .. import imports
from ..catalog import MODEL, Catalog, ModelSpec
from ..core.bn import index_bn_layers
from ..core.conv import use_double_backward_convs
from ..core.pool import use_channels_last_pools
from ..errors import FedL2PError
from . import guard
from .bn_swap import check_swap, plain_bn, replace_bn, require_bn

HEAD_ATTR = "_fedl2p_head"  # a declared classifier's module name, kept on the built model


def names(catalog: Catalog) -> tuple[str, ...]:
    return tuple(catalog.names(MODEL))


def spec(name: str, catalog: Catalog) -> ModelSpec:
    """The model `name` registered in `catalog`, or a `package.module:factory` reference its allow list permits."""
    found = catalog.find(MODEL, name)
    if found is not None:
        return found
    if ":" in name:
        return ModelSpec(_import_factory(name, catalog), name)
    return catalog.get(MODEL, name, hint=", or package.module:factory")


def _import_factory(ref: str, catalog: Catalog) -> Callable[..., nn.Module]:
    module, _, attr = ref.partition(":")
    try:  # the user named it (--model, --allow-import) or a loaded plugin's package holds it: models.guard's list
        fn = imports.load(ref, imports.Why.ALLOWED, allowed=partial(guard.allowed, catalog=catalog))
    except imports.ImportRefused as e:
        raise FedL2PError(f"--model {ref}: {e}; name it with --model or allow its module with --allow-import {module}") from None
    except Exception as e:  # noqa: BLE001 - ImportError, AttributeError, or the module's own error
        raise FedL2PError(f"--model {ref}: cannot load it ({e.__class__.__name__}: {e})") from None
    if not callable(fn):
        raise FedL2PError(f"--model {ref}: '{attr}' is not callable")
    return fn


def _call(factory: Callable[..., nn.Module], in_channels: int, num_classes: int) -> nn.Module:
    """`factory` with `in_channels=` and `num_classes=` where it takes them (a **kwargs factory, such as torchvision's,
    gets num_classes)."""
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kw = {"in_channels": in_channels} if "in_channels" in params else {}
    kw |= {"num_classes": num_classes} if "num_classes" in params or var_kw else {}
    return factory(**kw)


def build(name: str, in_channels: int, num_classes: int, seed: int = 0,
          input_shape: tuple[int, ...] | None = None, *, catalog: Catalog) -> nn.Module:
    """The model `name` (looked up in `catalog`) for this many input channels and classes, initialised from `seed`,
    its BN layers mixing BN. With `input_shape` ([C, H, W] of one input), a model with its own BatchNorm layers is
    checked on it: the swap keeps its eval outputs, it outputs one score per class, and it is twice differentiable
    (what FedL2P's meta-gradient needs: a layer that is not fails here, in one line, not in the middle of
    meta-train)."""
    s = spec(name, catalog)
    torch.manual_seed(seed)
    model = guard.call(name, s, lambda: _call(s.factory, in_channels, num_classes))
    if not isinstance(model, nn.Module):
        raise FedL2PError(f"model '{name}': its factory returned {type(model).__name__}, not a torch nn.Module")
    require_bn(model, name)
    if plain_bn(model):
        if input_shape is not None:
            example = torch.randn((2, *input_shape), generator=torch.Generator().manual_seed(0))
            check_swap(model, example, name)
            _check_classes(model, example, num_classes, name)
        replace_bn(model)
    if s.head is not None:
        _declared_head(model, s.head, name)
        setattr(model, HEAD_ATTR, s.head)
    model = use_channels_last_pools(use_double_backward_convs(index_bn_layers(model)))
    if input_shape is not None:
        check_twice_differentiable(model, input_shape, name)
    return model


def stored(art: Any, catalog: Catalog) -> nn.Module:
    """The model an artifact's config names (`model`, `in_channels`, `num_classes`, `seed`) in `catalog` (the reading
    stage's), refused unless its module is allowed."""
    c = art.config
    guard.check_stored_model(art, c["model"], catalog)
    return build(c["model"], c["in_channels"], c["num_classes"], c["seed"], catalog=catalog)


def check_twice_differentiable(model: nn.Module, input_shape: tuple[int, ...], name: str) -> None:
    """A Hessian-vector product of the training loss on two random inputs, on a copy of the model under a forked
    random state (the model, its BN statistics and torch's global generator are left as they were)."""
    probe = copy.deepcopy(model).train()
    params = [p for p in probe.parameters() if p.requires_grad]
    with torch.random.fork_rng(devices=[]):
        x = torch.randn((2, *input_shape), generator=torch.Generator().manual_seed(0))
        try:
            loss = probe(x).logsumexp(dim=1).mean()
            grads = [g for g in torch.autograd.grad(loss, params, create_graph=True, allow_unused=True) if g is not None]
            second = sum((g * g).sum() for g in grads if g.requires_grad)
            if isinstance(second, torch.Tensor):
                torch.autograd.grad(second, params, allow_unused=True)
        except (RuntimeError, NotImplementedError) as e:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
            raise FedL2PError(f"model '{name}' is not twice differentiable ({reason}); FedL2P differentiates through "
                              "fine-tuning: replace that layer by one autograd differentiates twice (e.g. nn.Hardsigmoid "
                              "by relu6(x + 3) / 6)") from None


def _check_classes(model: nn.Module, example: torch.Tensor, num_classes: int, name: str) -> None:
    with torch.no_grad():
        out = model.eval()(example)
    model.train()
    if tuple(out.shape) != (len(example), num_classes):
        raise FedL2PError(f"model '{name}' outputs shape {tuple(out.shape)} for {len(example)} inputs; the partition has "
                          f"{num_classes} classes (does its factory take num_classes?)")


def _declared_head(model: nn.Module, head: str, name: str) -> None:
    try:
        model.get_submodule(head)
    except AttributeError:
        raise FedL2PError(f"model '{name}' declares head '{head}', which is not one of its modules") from None


def head_prefix(model: nn.Module) -> str:
    """Parameter-name prefix of the classifier (declared at registration, else the last Linear layer): what FedBABU
    freezes and --reset-head replaces."""
    declared = getattr(model, HEAD_ATTR, None)
    if declared:
        return declared + "."
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise FedL2PError("the model has no nn.Linear classifier; declare its head: registry.add_model(..., head='name')")
    return names[-1] + "."


def param_names(model: nn.Module) -> list[str]:
    return [n for n, _ in model.named_parameters()]
