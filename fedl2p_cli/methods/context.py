"""What a method is handed in `personalize`, typed: the personalisation being prepared (`Setup`), one of its rows
(`Row`), and one client and seed on the personalisation harness (`ClientContext`, with its fine-tunings, `Trial`).
Protocols, declared beside the methods (methods/registry.py: one module, no import circle between the two);
stages/personalize.py and stages/harness.py implement them; a method depends on these, not on the stages."""

from __future__ import annotations

from .registry import Client, ClientContext, Row, Setup, Trial

__all__ = ["Client", "ClientContext", "Row", "Setup", "Trial"]
