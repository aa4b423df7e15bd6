"""The personalisation methods, one registered object each (`registry.py`): what `fedl2p personalize`, `analyze`,
the pipeline and the benchmarks ask about a method. The built-in ones (`builtin.py`) and a plugin's are registered by
the plugin loader (fedl2p_cli/plugins.py) before the first question is answered."""

from . import check, registry
from .registry import (
    Checked,
    HandMade,
    Learned,
    Method,
    System,
    Tuned,
    baselines,
    find,
    get,
    handmade,
    label,
    learned,
    names,
    systems,
)

__all__ = ["Checked", "HandMade", "Learned", "Method", "System", "Tuned", "baselines", "find", "get", "handmade", "label",
           "learned", "names", "check", "registry", "systems"]
