"""How numbers read in tables."""

from __future__ import annotations


def signed(v: float, digits: int = 2) -> str:
    """A difference with its sign (+0.31, -1.07); one that rounds to zero is "0.00", never "-0.00" or "+0.00"."""
    s = f"{v:+.{digits}f}"
    return s[1:] if float(s) == 0 else s
