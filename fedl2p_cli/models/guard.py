"""Which model code may run: an artifact's text never chooses a module to import (issue 51).

A model named `package.module:factory` is imported only when the user named it: `--model` (or a pipeline's `model`) on
this command, `fedl2p --allow-import MODULE` (or FEDL2P_ALLOW_IMPORT), or a loaded plugin's own module. Loading an
artifact that names another is one line saying which module it asks for and how to allow it. The list is the
command's Runtime's (`allow_import`, set at the command line's edge and never changed after), seen here through the
catalog each caller hands over (`Catalog.allowing`); worker processes and Flower simulation nodes receive it in their
Runtime."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..catalog import MODEL, Catalog
from ..errors import ArtifactError, FedL2PError


def allowed_modules(catalog: Catalog) -> list[str]:
    return list(catalog.allowed)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def allowed(module: str, catalog: Catalog) -> bool:
    """`module` is one the user named (the catalog's allow list) or a loaded plugin's."""
    return any(_within(module, m) for m in [*allowed_modules(catalog), *catalog.active()])


def check_stored_model(art: Any, ref: str, catalog: Catalog) -> None:
    """Refuse to build the model an artifact names unless its module is allowed (a registered name always is)."""
    if ":" not in ref or catalog.find(MODEL, ref) is not None:
        return
    module = ref.partition(":")[0]
    if not allowed(module, catalog):
        raise ArtifactError(f"artifact {art.stage}/{art.id} asks for the model '{ref}': fedl2p imports no module an "
                            f"artifact names unless you do; if you trust it, add --allow-import {module} (fedl2p "
                            f"--allow-import {module} COMMAND, or FEDL2P_ALLOW_IMPORT={module})")


def call(name: str, spec: Any, call_factory: Callable[[], Any]) -> Any:
    """A user's factory (a `package.module:factory` or a plugin's model) that raises: one line naming it; a built-in
    one's error is ours and propagates."""
    try:
        return call_factory()
    except FedL2PError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's code
        if spec.plugin is not None and spec.plugin.builtin:
            raise
        factory = getattr(spec.factory, "__qualname__", repr(spec.factory))
        who = f"--model {name}" + (f" (from {spec.plugin.describe()})" if spec.plugin is not None else "")
        raise FedL2PError(f"{who}: its factory {factory}() raised {e.__class__.__name__}: {e}") from None
