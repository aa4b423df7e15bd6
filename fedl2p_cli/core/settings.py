"""The settings that the maths and the engine read, as typed, documented config dataclasses without torch: choices
as `Literal`s, and MetaConfig (the client update's options) and RoundPolicy (what a round does when clients fail). The stage configs (fedl2p_cli/configs.py) nest them; the command line and pipeline files are generated
from all of them, so `fedl2p --help` never imports torch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from .config import AT_LEAST_1, FRACTION, NON_NEGATIVE, POSITIVE, UNIT, between, opt

MetaGrad = Literal["ift", "fomaml"]
IftAt = Literal["star", "last-step"]
Hessian = Literal["fo", "exact"]
ClientBNMode = Literal["precise", "running"]      # how the client's statistics for evaluation are obtained
EvalStats = Literal["running", "test-batch"]      # what a learned beta mixes with the pretrained statistics at test time
HiddenBias = Literal["paper", "zero"]             # App. E: every bias is the constant; zero: hidden biases 0 (ablation)
BetaOutput = Literal["ste-clamp", "sigmoid"]       # how BNNet's output becomes beta in [0, 1]
Aggregator = Literal["mean", "median", "trimmed-mean"]  # how the server combines the clients' lambdas
Engine = Literal["local", "flower"]
DEFAULT_META_LR = {"bnnet": 1e-3, "lrnet": 1e-3, "eta": 1e-4}  # App. E's SGD learning rates of BNNet, LRNet and eta~
DEFAULT_PSI_POWER = 5  # power iterations for psi = min(psi, 0.5/lambda_max): the Neumann series converges (not in the paper)
DEFAULT_ETA_BOUND = 10.0  # eta~ kept within [base LR / 10, base LR x 10] under the IFT (not in the paper)
LEGACY_IFT = {"psi_power": 0, "scale_by_psi": False}  # the paper's Alg. 2 literally: the IFT defaults before the fix


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
    psi_power: int = opt(DEFAULT_PSI_POWER, "N > 0: estimate the top eigenvalue of the training-loss Hessian by N "
                         "power iterations (N extra Hessian-vector products) and use psi = min(--psi, 0.5/lambda_max), so "
                         "the Neumann series converges. 0: the paper's fixed psi, which diverges where psi * lambda_max "
                         "> 2 (measured lambda_max 60-560 on small-cnn clients: the series then flips the sign of the "
                         "eta~ hypergradient and eta~ runs away). Variant suffix -psifixed at 0.", NON_NEGATIVE)
    eta_bound: float = opt(DEFAULT_ETA_BOUND, "IFT only: after each meta-step keep every eta~ within [base LR / B, base "
                           "LR x B] (0: unbounded, the paper). Why: the converged IFT hypergradient of eta~ under Eq. 9-10 "
                           "is ~ dL_V/dtheta . dL_T/dtheta per tensor, positive whenever training and validation gradients "
                           "agree, so eta~ falls at the clip rate every step (measured: x0.73 in 3 rounds on the planted "
                           "cell) and would turn negative (gradient ascent). Not in the paper. Variant suffix -etab<B> "
                           "when not the default.", NON_NEGATIVE)
    scale_by_psi: bool = opt(True, "Multiply p by psi as Lorraine et al. do (then p -> H^-1 v). --no-scale-by-psi: the "
                             "paper's Alg. 2, whose unscaled p is ~lambda_max times H^-1 v once psi ~ 1/lambda_max. "
                             "Variant suffix -unscaled.")
    meta_grad: MetaGrad = opt("ift", "ift (implicit function theorem, Alg. 2) | fomaml (FOMAML+, App. F).")
    hessian: Hessian = opt("fo", "fo: Hessian of CE at theta' with the inner gradient held constant (second order, "
                           "~10x an SGD step) | exact: full Hessian of L_T of Eq. 9-10 (third order, ~30-40x).")
    fixed_beta: float = opt(1.0, "Fixed beta when BNNet is off (1: client statistics, 0: pretrained).", UNIT, option="--beta")
    lr_bnnet: float = opt(DEFAULT_META_LR["bnnet"], "SGD learning rate of BNNet.", NON_NEGATIVE)
    lr_lrnet: float = opt(DEFAULT_META_LR["lrnet"], "SGD learning rate of LRNet.", NON_NEGATIVE)
    lr_eta: float = opt(DEFAULT_META_LR["eta"], "SGD learning rate of eta~.", NON_NEGATIVE)
    client_bn: ClientBNMode = opt("precise", "Client BN statistics for the validation loss after fine-tuning: precise = "
                                  "recomputed under the fine-tuned weights and the same beta (consistent with evaluation; "
                                  "not in the paper) | running = the paper's momentum-0.1 running statistics (stale for "
                                  "layers >= 2).")
    hidden_bias: HiddenBias = opt("paper", "Meta-net init: paper = every bias the constant 0.5 (BNNet) / 1.0 (LRNet), as "
                                  "App. E and the authors' code | zero = hidden biases 0 (an ablation: input weights then "
                                  "receive almost no gradient).")
    # the options below were added after artifacts existed: left out of the artifact id at their defaults
    beta_init: float = opt(0.5, "Constant of every BNNet bias, so every client's initial beta (App. E: 0.5). Another "
                           "value is not in the paper: where the best fixed beta is near 1 (BN C) the meta-gradient moves "
                           "beta too slowly from 0.5 in a small budget; starting near it lets clients move away from it "
                           "instead.", UNIT, identity_default=True)
    init_gain: float = opt(0.1, "Xavier gain of the meta-nets' weights (App. E: 0.1). Another value is not in the paper: "
                           "at 0.1 an output moves by ~1e-3 per unit of input, so every client gets the same beta and eta "
                           "to 3-5 decimals and the input weights must grow ~100x before the meta-nets can tell clients "
                           "apart; a larger gain starts them input-sensitive.", POSITIVE, identity_default=True)
    ift_at: IftAt = opt("star", "Where the IFT differentiates L_T of Eq. 9-10: star = at theta* with one more in-graph "
                        "step on a fresh train batch (this project's first reading) | last-step = the last fine-tuning "
                        "step, L_T(theta_prev) with theta' = theta* on that step's batch, as the authors' code and the "
                        "paper's 'theta* = theta'' (Sec. 3.3); with --hessian fo it reuses that step's gradient, one "
                        "forward-backward fewer per hypergradient.", identity_default=True)
    val_stats: EvalStats = opt("running", "BN statistics of the validation loss the meta-nets learn on: running = beta "
                               "mixes the client's statistics (the paper's inference) | test-batch = beta mixes each "
                               "validation batch's own statistics (not in the paper): meta-nets for `fedl2p personalize "
                               "--eval-stats test-batch`, which evaluates that way. Variant suffix -valtbs.",
                               identity_default=True)
    eta_nonneg: bool = opt(False, "Clamp eta~ at 0 (straight-through), so no learned LR is negative: a tensor the "
                           "meta-gradient pushes below 0 is frozen (counted as sparsity) instead of moved uphill by "
                           "gradient ascent. Not in the paper (the authors' eta~ is unconstrained). Variant suffix -etapos.",
                           flag=True, identity_default=True)
    beta_output: BetaOutput = opt("ste-clamp", "How BNNet's output becomes beta in [0, 1]: ste-clamp = clamped, with a "
                                  "straight-through (identity) gradient (App. E) | sigmoid = a logistic output, which "
                                  "App. E reports trying (the same solution, more slowly); its output bias starts at "
                                  "logit(--beta-init). Not the paper's default. Why offered: the clamp passes gradient on "
                                  "however far past 1 an output runs (raw BNNet outputs of 2-8 on the planted cell), a "
                                  "sigmoid's fades as it saturates. Measured there it is not better: beta moves ~4x more "
                                  "slowly (slope <= 1/4), and with --lr-bnnet x4 the kinds' beta split less than under "
                                  "the clamp. Variant suffix -sigmoid.", identity_default=True)

    @property
    def meta_lrs(self) -> dict[str, float]:
        return {"bnnet": self.lr_bnnet, "lrnet": self.lr_lrnet, "eta": self.lr_eta}


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
