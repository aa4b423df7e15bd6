"""The built-in methods: the paper's hand-made baselines (Sec. 4), ft-tuned (ours, a stronger baseline), FedL2P and
L2P (the paper's method and its local ablation), and the other personalised-FL systems (pFedLA, HeurpFedLA, CAFeMe)."""

from __future__ import annotations

from ..core.selection import candidates
from .registry import HandMade, Learned, System, Tuned, register

BUILTIN = (
    register(HandMade("ft-bnc", "FT (BN C)", beta=1.0)),    # the client's own statistics
    register(HandMade("ft-bng", "FT (BN G)", beta=0.0)),    # the pretrained (global) statistics
    register(HandMade("ft-bni", "FT (BN I)", beta=None)),   # each batch's statistics, also at test time
    register(Tuned("ft-tuned", "FT tuned (val)", candidates=candidates)),
    register(Learned("fedl2p", "FedL2P", family="fedl2p")),
    register(Learned("l2p", "L2P", family="l2p", pools=("seen",))),  # a lambda per client it trained: none for others
    register(System("pfedla", "pFedLA", pools=("seen",))),           # per-client aggregation weights: seen clients only
    register(System("heurpfedla", "HeurpFedLA", pools=("seen",))),
    register(System("cafeme", "CAFeMe")),                            # a modulator that personalises any client
)
