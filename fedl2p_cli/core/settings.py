"""The settings that the maths and the engine read, as typed, documented config dataclasses without torch: choices
as `Literal`s, and MetaConfig (the client update's options) and RoundPolicy (what a round does when clients fail).
The stage configs (fedl2p_cli/configs.py) nest them; the command line and pipeline files are generated from all of them,
so `fedl2p --help` never imports torch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from .config import AT_LEAST_1, NON_NEGATIVE, POSITIVE, UNIT, Tag, between, opt

IftAt = Literal["star", "last-step"]
EtaGrad = Literal["last-step", "ift"]             # where the learned LRs' meta-gradient comes from under the IFT
Hessian = Literal["fo", "exact"]
ClientBNMode = Literal["precise", "running"]      # how the client's statistics for evaluation are obtained
EvalStats = Literal["running", "test-batch"]      # what a learned beta mixes with the pretrained statistics at test time
HiddenBias = Literal["paper", "zero"]             # App. E: every bias is the constant; zero: hidden biases 0 (ablation)
BetaOutput = Literal["ste-clamp", "sigmoid"]       # how BNNet's output becomes beta in [0, 1]
# --aggregate's words in variant names (else its name)
AGGREGATE_TAGS = {"trimmed-mean": "trim", "equal-norm": "eqnorm", "equal-norm-tensor": "eqnormt"}
DEFAULT_META_LR = {"bnnet": 1e-3, "lrnet": 1e-3, "eta": 1e-4}  # App. E's SGD learning rates of BNNet, LRNet and eta~
LEARN_META_LR = 0.01  # the learn preset's BNNet and LRNet SGD steps (the log head's zero-initialised outputs)
LR_GRAD_TAGS = {"trajectory": "traj", "trajectory-bn": "trajbn", "unrolled": "unroll"}  # --lr-grad's words in variant names
DEFAULT_LOGETA_LR = 0.05  # --head log: SGD step of log eta~ (a 0.05 step moves every client's LR of a tensor by ~5%)
DEFAULT_PSI_POWER = 3  # Krylov products for psi = min(psi, 0.5/lambda_max), shared with the Q = 3 series (not in the paper)
DEFAULT_ETA_BOUND = 10.0  # eta~ kept within [base LR / 10, base LR x 10] under the IFT (not in the paper)
DEFAULT_ETA_GRAD = "last-step"  # the learned LRs' meta-gradient through the last fine-tuning step (not in the paper)
LEGACY_IFT = {"psi_power": 0, "scale_by_psi": False}  # the paper's Alg. 2 literally: the IFT defaults before the fix


def _ift(m: MetaConfig) -> bool:
    """The IFT's own options name a variant only under the IFT (FOMAML+ ignores them)."""
    return m.meta_grad == "ift"


@dataclass(kw_only=True)
class MetaConfig:
    """The client update's settings (Alg. 1 lines 6-12, Alg. 2, App. E): every `fedl2p meta-train` option of the
    meta-gradient, and of `flower run-config`. Help texts are the options' --help."""
    iterations: int = opt(3, "K: meta-iterations per client per round (the authors' CIFAR-10 config: 3).", AT_LEAST_1,
                          option="--iterations", short="-k")
    epochs: int = opt(5, "e: fine-tuning epochs per iteration (paper: 5 or 15).", AT_LEAST_1, option="--epochs", short="-e")
    batch_size: int = opt(32, "Batch size of fine-tuning and of the hypergradient's batches.", between(2))
    base_lr: float = opt(1e-3, "Base fine-tuning LR: initial eta~ and the LR when LRNet is off.", POSITIVE)
    q: int = opt(3, "Q: Neumann-series terms of the inverse-Hessian approximation (Alg. 2).", NON_NEGATIVE)
    psi: float = opt(0.1, "psi: Neumann step size (Alg. 2).", POSITIVE)
    psi_power: int = opt(DEFAULT_PSI_POWER, "Krylov products for lambda_max (the series reuses them); psi = min(--psi, "
                                            "0.5/lambda_max). 0: the paper's fixed psi. See docs/explanation/ift.md.",
                                            NON_NEGATIVE,
                          tag=Tag(lambda v, m: "psifixed" if v == 0 else f"psipow{v}", 40, _ift))
    eta_bound: float = opt(DEFAULT_ETA_BOUND, "IFT only: keep every eta~ within [base LR / B, base LR x B] after each "
                                              "meta-step; 0: unbounded (the paper). See docs/explanation/ift.md.",
                                              NON_NEGATIVE, tag=Tag("etab{v:g}", 60, _ift))
    eta_grad: EtaGrad = opt(DEFAULT_ETA_GRAD, "IFT only: the learned LRs' meta-gradient: last-step = through the last "
                                              "fine-tuning step | ift = Alg. 2's implicit term. See docs/explanation/ift.md.",
                            tag=Tag("eta{v}", 70, _ift))
    scale_by_psi: bool = opt(True, "Multiply the Neumann sum p by psi (Lorraine et al.), so p -> H^-1 v; "
                                   "--no-scale-by-psi: the paper's Alg. 2.", tag=Tag("unscaled", 50, _ift))
    # the default moved from the paper's ift (and beta_init's from 0.5) after the bench cells measured FOMAML+ from
    # beta 0.9 ahead: `reference` keeps the paper's values as what ids and variant names are measured against
    # a catalog entry (algorithms/meta_grads.py; the stage checks the name): its name is its tag, so a plugin's names itself
    meta_grad: str = opt("fomaml", "fomaml = FOMAML+ (App. F) | ift = the implicit function theorem (Alg. 2, the "
                                   "paper's) | a plugin's. See docs/method/fedl2p.md#which-variant.<plugin-meta-grads>",
                         tag=Tag("{v}", 10), reference="ift")
    hessian: Hessian = opt("fo", "fo = Hessian of CE at theta', inner gradient held constant (~10x an SGD step) | "
                                 "exact = full Hessian of Eq. 9-10 (~30-40x).",
                           tag=Tag("exact", 20, lambda m: m.meta_grad != "fomaml"))
    fixed_beta: float = opt(1.0, "Fixed beta when BNNet is off (1: client statistics, 0: pretrained).", UNIT, option="--beta")
    lr_bnnet: float = opt(LEARN_META_LR, "SGD learning rate of BNNet (App. E: 0.001).", NON_NEGATIVE,
                          tag=Tag("bnnetlr{v:g}", 190), reference=DEFAULT_META_LR["bnnet"])
    lr_lrnet: float = opt(LEARN_META_LR, "SGD learning rate of LRNet (App. E: 0.001).", NON_NEGATIVE,
                          tag=Tag("lrnetlr{v:g}", 200), reference=DEFAULT_META_LR["lrnet"])
    lr_eta: float = opt(DEFAULT_META_LR["eta"], "SGD learning rate of eta~.", NON_NEGATIVE,
                         tag=Tag("etalr{v:g}", 210))
    client_bn: ClientBNMode = opt("precise", "Client BN statistics after fine-tuning: precise = recomputed under the "
                                             "fine-tuned weights (not in the paper) | running = the paper's.",
                                tag=Tag("runningbn", 140))
    hidden_bias: HiddenBias = opt("paper", "Meta-net biases: paper = every bias 0.5 (BNNet) / 1.0 (LRNet), as App. E | "
                                           "zero = hidden biases 0 (an ablation).", tag=Tag("zerobias", 110))
    # the options below were added after artifacts existed: left out of the artifact id at their reference values
    beta_init: float = opt(0.5, "Every client's initial beta, BNNet's bias constant (App. E: 0.5; --preset fomaml: 0.9, "
                                "near the clients' own statistics). See docs/method/fedl2p.md.", UNIT,
                           identity_default=True, tag=Tag("binit{v:g}", 120), reference=0.5)
    init_gain: float = opt(0.1, "Xavier gain of the meta-nets' weights (App. E: 0.1); a larger gain lets them tell "
                                "clients apart from the start.", POSITIVE, identity_default=True,
                            tag=Tag("gain{v:g}", 130))
    ift_at: IftAt = opt("star", "Where the IFT differentiates L_T (Eq. 9-10): star = at theta* plus one step | "
                                "last-step = the last fine-tuning step (authors' code).", identity_default=True,
                        tag=Tag("laststep", 150, _ift))
    val_stats: EvalStats = opt("running", "Validation-loss BN statistics: running = beta mixes the client's (the "
                                          "paper) | test-batch = each batch's, for --eval-stats test-batch.",
                               identity_default=True, tag=Tag("valtbs", 160))
    eta_nonneg: bool = opt(False, "Clamp eta~ at 0 (straight-through): a tensor pushed below 0 is frozen instead of "
                                  "trained by gradient ascent. Not in the paper.",
                           flag=True, identity_default=True, tag=Tag("etapos", 170))
    beta_output: BetaOutput = opt("ste-clamp", "How BNNet's output becomes beta: ste-clamp = clamp to [0, 1], "
                                               "straight-through gradient (App. E) | sigmoid = a logistic output.",
                                               identity_default=True, tag=Tag("sigmoid", 180))

    # a catalog entry (algorithms/heads.py; the stage checks the name): its name is its tag, so a plugin's names itself
    head: str = opt("log", "The meta-nets' outputs as beta and eta: paper (App. E) | log = every client starts "
                             "equal (docs/method/fedl2p.md#the-log-head) | a plugin's.<plugin-meta-heads>",
                    identity_default=True, tag=Tag("{v}", 105), reference="paper")
    lr_logeta: float = opt(DEFAULT_LOGETA_LR, "--head log: SGD learning rate of log eta~ (a relative step).",
                           NON_NEGATIVE, identity_default=True,
                           tag=Tag("logetalr{v:g}", 215, lambda m: m.head == "log"))
    # a catalog entry (algorithms/lr_grads.py): the built-ins keep their short tags, a plugin's names itself
    lr_grad: str = opt("trajectory-bn", "The LRs' meta-gradient: last-step (App. F) | trajectory (whole "
                                        "fine-tuning) | trajectory-bn (+ BN statistics) | unrolled (exact) | "
                                        "a plugin's.<plugin-lr-grads>",
                       identity_default=True, tag=Tag(lambda v, _m: LR_GRAD_TAGS.get(v, v), 75), reference="last-step")

    # a catalog entry (algorithms/meta_signals.py): its name is its word, a plugin's names itself
    meta_signal: str = opt("loss", "Each client's meta-gradient: loss = dL_V/dlambda (the paper) | log-loss = "
                                       "d log L_V/dlambda (low-loss clients heard too) | a plugin's.<plugin-meta-signals>",
                           identity_default=True, tag=Tag(lambda v, _m: v.replace("-", ""), 95))

    @property
    def meta_lrs(self) -> dict[str, float]:
        return {"bnnet": self.lr_bnnet, "lrnet": self.lr_lrnet, "eta": self.lr_eta, "logeta": self.lr_logeta}


@dataclass(frozen=True)
class RoundPolicy:
    """What a round does when clients fail (Flower's accept_failures, made explicit). A round waits `timeout` seconds
    for its replies (None: no limit; the executor enforces it), aggregates what arrived when at least `min_answers`
    of the sampled clients answered, and otherwise samples the round afresh, up to `retries` times, then stops."""
    timeout: float | None = None
    min_answers: float = 1.0
    retries: int = 0

    def needed(self, sampled: int) -> int:
        return max(1, math.ceil(self.min_answers * sampled - 1e-9))
