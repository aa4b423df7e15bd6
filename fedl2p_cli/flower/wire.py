"""Tasks and client results as (tensors, JSON skeleton): what crosses a Flower message, with no pickle.

A task or result is a nest of tensors, dicts with string keys, lists, tuples, numbers, strings, None and this
package's dataclasses (e.g. `ClientResult`). `pack` moves every tensor into a flat name -> tensor dict (an ArrayRecord
on the wire) and describes the rest as JSON; `unpack` rebuilds the same nest. Floats go through JSON's repr, tensors
through their raw bytes, so a round trip is exact. A dataclass is rebuilt only if it lives in `fedl2p_cli` or in a
module of one of the receiver's plugins (`plugin_roots(catalog)`: the catalog it was handed) that is already
imported (a pFL system's task): a message can import nothing and name no other code to run.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, cast

from torch import Tensor

from .. import imports

if TYPE_CHECKING:
    from ..catalog import Catalog

_PACKAGE = __name__.split(".")[0]


def pack(obj: Any) -> tuple[dict[str, Tensor], str]:
    tensors: dict[str, Tensor] = {}
    return tensors, json.dumps(_encode(obj, tensors))


def _encode(obj: Any, tensors: dict[str, Tensor]) -> Any:
    if isinstance(obj, Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = obj.detach().contiguous()
        return {"$t": name}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        fields = {f.name: _encode(getattr(obj, f.name), tensors) for f in dataclasses.fields(obj)}
        return {"$dc": f"{cls.__module__}:{cls.__qualname__}", "f": fields}
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise TypeError("wire: dict keys must be strings")
        return {"$d": {k: _encode(v, tensors) for k, v in obj.items()}}
    if isinstance(obj, (list, tuple)):
        return {"$l" if isinstance(obj, list) else "$u": [_encode(v, tensors) for v in obj]}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if hasattr(obj, "item") and getattr(obj, "shape", None) == ():  # numpy scalar
        return obj.item()
    raise TypeError(f"wire: cannot send a {type(obj).__name__}")


def plugin_roots(catalog: Catalog) -> frozenset[str]:
    """The top-level packages of the catalog's loaded plugins (the built-ins aside): whose dataclasses `unpack` may
    rebuild besides fedl2p's own."""
    return frozenset(m.split(".")[0] for m in catalog.active())


def unpack(tensors: dict[str, Tensor], skeleton: str, roots: Collection[str]) -> Any:
    """The nest `pack` described; a dataclass only from fedl2p or from an imported module under `roots`."""
    return _decode(json.loads(skeleton), tensors, frozenset(roots))


def _decode(node: Any, tensors: dict[str, Tensor], roots: frozenset[str]) -> Any:
    if not isinstance(node, (dict, list)):
        return node
    if isinstance(node, list):  # a list is sent as {"$l": [...]}
        raise ValueError("wire: malformed skeleton")
    if "$t" in node:
        return tensors[node["$t"]]
    if "$d" in node:
        return {k: _decode(v, tensors, roots) for k, v in node["$d"].items()}
    if "$l" in node:
        return [_decode(v, tensors, roots) for v in node["$l"]]
    if "$u" in node:
        return tuple(_decode(v, tensors, roots) for v in node["$u"])
    if "$dc" in node:
        return _dataclass(node["$dc"], roots)(**{k: _decode(v, tensors, roots) for k, v in node["f"].items()})
    raise ValueError("wire: malformed skeleton")


def _dataclass(path: str, roots: frozenset[str]) -> type:
    module = path.partition(":")[0]
    why = imports.Why.OWN if imports.within(module, _PACKAGE) else imports.Why.ALLOWED  # ALLOWED: a loaded plugin's
    try:
        cls = imports.load(path, why, allowed=lambda m: _plugin_module(m, roots))
    except imports.ImportRefused:
        raise ValueError(f"wire: refusing to rebuild '{path}' (not a dataclass of {_PACKAGE} or of a loaded plugin)") from None
    if not dataclasses.is_dataclass(cls):
        raise ValueError(f"wire: '{path}' is not a dataclass")
    return cast(type, cls)  # a dataclass that pack found as a value's type


def _plugin_module(module: str, roots: frozenset[str]) -> bool:
    """`module` is imported already and belongs to one of the plugins' packages (`roots`)."""
    return module in sys.modules and module.split(".")[0] in roots
