"""The meta-net heads a FedL2P run can take (`meta-train --head NAME`): catalog entries of kind "meta-head",
registered like a meta-gradient (`registry.add_meta_head`). A head draws lambda (`init`) and maps (lambda, xi, x) to
a client's strategy (`hyperparameters`: beta per BN layer, an LR per parameter tensor). The maths lives in
core/metanets.py; these entries name it. The built-ins: the paper's (App. E) and the log head
(docs/method/fedl2p.md#the-log-head)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..protocols import MetaHead

if TYPE_CHECKING:
    from torch import Tensor

    from ..core.metanets import Lambda
    from ..core.settings import MetaConfig


@dataclass(frozen=True)
class PaperHead:
    """App. E: BNNet's output clamped to [0, 1] (straight-through), eta = clamp(LRNet, 0, 1000) x eta~; Xavier weights
    at `--init-gain`, every bias the constant (`--hidden-bias`, `--beta-init`, `--beta-output`, `--eta-nonneg`)."""
    name: str = "paper"
    about: str = "App. E: clamp(BNNet) and clamp(LRNet) x eta~, biases at their constants"

    def init(self, n_bn: int, n_x: int, n_params: int, cfg: MetaConfig, nets: str, seed: int) -> Lambda:
        from ..core.metanets import init_lambda
        return init_lambda(n_bn, n_x, n_params, cfg.base_lr, nets, seed, cfg.hidden_bias, cfg.beta_init, cfg.init_gain,
                           cfg.beta_output)

    def hyperparameters(self, lam: Lambda, xi: Tensor, x: Tensor, n_params: int,
                        cfg: MetaConfig) -> tuple[Tensor, Tensor]:
        from ..core.metanets import hyperparameters
        return hyperparameters(lam, xi, x, n_params, cfg.base_lr, cfg.fixed_beta, cfg.eta_nonneg, cfg.beta_output)


@dataclass(frozen=True)
class LogHead:
    """sigmoid(BNNet), eta~ x exp(tanh-bounded LRNet), zero-initialised output layers: every client starts at
    (`--beta-init`, the base LR) and a split between clients can only be learned (not in the paper)."""
    name: str = "log"
    about: str = "sigmoid(BNNet), eta~ x exp(LRNet), zero-initialised outputs: every client starts equal"

    def init(self, n_bn: int, n_x: int, n_params: int, cfg: MetaConfig, nets: str, seed: int) -> Lambda:
        from ..core.metanets import init_log_lambda
        return init_log_lambda(n_bn, n_x, n_params, cfg.base_lr, nets, seed, cfg.beta_init)

    def hyperparameters(self, lam: Lambda, xi: Tensor, x: Tensor, n_params: int,
                        cfg: MetaConfig) -> tuple[Tensor, Tensor]:
        from ..core.metanets import log_hyperparameters
        return log_hyperparameters(lam, xi, x, n_params, cfg.base_lr, cfg.fixed_beta)


BUILTIN: tuple[MetaHead, ...] = (PaperHead(), LogHead())


def builtin(name: str) -> MetaHead:
    """The built-in head `name`; a plugin's comes from the catalog, which the stage passes down."""
    for head in BUILTIN:
        if head.name == name:
            return head
    raise ValueError(f"'{name}' is not a built-in meta-net head: pass the catalog's entry")
