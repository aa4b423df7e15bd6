"""How a stage reports progress: the one protocol the CLI's rich bar, a deployment's log and tests' no-op implement
(torch-free, below the stages, so the plugin API can name it)."""

from __future__ import annotations

from typing import Any, Protocol


class Progress(Protocol):
    """How a stage reports progress; the CLI passes a rich bar, tests a no-op."""

    def start(self, description: str, total: int) -> None: ...
    def advance(self, n: int = 1, **info: Any) -> None: ...
    def stop(self) -> None: ...


class NoProgress:
    def start(self, description: str, total: int) -> None:
        pass

    def advance(self, n: int = 1, **info: Any) -> None:
        pass

    def stop(self) -> None:
        pass
