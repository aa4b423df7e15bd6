"""The built-in methods: the paper's hand-made baselines (Sec. 4), ft-tuned (ours, a stronger baseline), FedL2P and
L2P (the paper's method and its local ablation), and the other personalised-FL systems (pFedLA, HeurpFedLA, CAFeMe).
Registered by fedl2p_cli/builtin.py, through the same plugin registry as a user's methods."""

from __future__ import annotations

from ..core.selection import candidates
from .registry import Checked, HandMade, Learned, System, Tuned

SYSTEMS = "fedl2p_cli.algorithms.systems"  # the systems' classes, imported when used

METHODS = (
    HandMade("ft-bnc", "FT (BN C)", beta=1.0),    # the client's own statistics
    HandMade("ft-bng", "FT (BN G)", beta=0.0),    # the pretrained (global) statistics
    HandMade("ft-bni", "FT (BN I)", beta=None),   # each batch's statistics, also at test time
    Tuned("ft-tuned", "FT tuned (val)", candidates=candidates),
    Learned("fedl2p", "FedL2P", family="fedl2p"),
    Learned("l2p", "L2P", family="l2p", pools=("seen",)),  # a lambda per client it trained: none for others
    Checked("fedl2p-checked", "FedL2P checked (val)", family="fedl2p"),  # its strategy at LR x0.1/1/10 or none, by val
)
SYSTEMS_BUILTIN = (
    # per-client aggregation weights: a model for the clients it trained only
    System("pfedla", "pFedLA", pools=("seen",), trainer=f"{SYSTEMS}.pfedla:PFedLA"),
    System("heurpfedla", "HeurpFedLA", pools=("seen",), trainer=f"{SYSTEMS}.pfedla:PFedLA"),
    System("cafeme", "CAFeMe", trainer=f"{SYSTEMS}.cafeme:CAFeMe"),  # a modulator that personalises any client
)
