"""The personalisation methods, one registered object each (`registry.py`): what `fedl2p personalize`, `analyze`,
the pipeline and the benchmarks ask about a method. Importing this package registers the built-in ones."""

from .registry import (HandMade, Learned, Method, System, Tuned, baselines, get, handmade, label, learned_of, names, register,
                       systems)
from .builtin import BUILTIN  # registers FT BN C/G/I, ft-tuned, FedL2P and L2P, pFedLA, HeurpFedLA, CAFeMe

__all__ = ["BUILTIN", "HandMade", "Learned", "Method", "System", "Tuned", "baselines", "get", "handmade", "label", "learned_of", "names",
           "register", "systems"]
