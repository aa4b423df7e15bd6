"""What a method is handed in `personalize`, typed: the personalisation being prepared (`Setup`), one of its rows
(`Row`), and one client and seed on the personalisation harness (`ClientContext`, with its fine-tunings, `Trial`).
Protocols of the bottom floor (fedl2p_cli/protocols.py); stages/personalize.py and stages/harness.py implement them;
a method depends on these, not on the stages."""

from __future__ import annotations

from ..protocols import Client, ClientContext, Row, Setup, Trial

__all__ = ["Client", "ClientContext", "Row", "Setup", "Trial"]
