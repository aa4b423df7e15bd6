"""CAFeMe (Vettoruzzo et al., SDM 2024, Alg. 1-2): a client's meta-update and a new client's personalisation.

omega = {mu: the modulator, psi: the base model's parameters}, both dicts of tensors keyed "mu.<name>" and
"psi.<name>". Personalisation (Alg. 2): S SGD steps of size alpha on (mu, psi), each on a fresh batch, the loss
taken through the gated base model f_psi | zeta with zeta = g_mu(batch); then zeta from the last batch. Meta-update
(Alg. 1 line 8): the loss of f_psi' | zeta on the client's held-out split, differentiated with respect to omega.
Inner gradients are first order by default (the authors' public code: no graph through the inner steps);
`order="second"` differentiates through them (the paper's Eq. 3.3). The outer step is Adam with moments kept per
client across rounds (`outer="adam"`: the authors' code; the paper allows "any optimizer of choice, e.g., Adam");
`outer="sgd"` is the plain gradient step written in Alg. 1 line 8.

The base model's BN layers normalise with batch statistics in every forward here (training and test), as MAML
implementations do; running statistics play no part.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from ..core.functional import random_batch
from ..core.metanets import adam_step
from ..core.modulate import gated, modulator

Omega = dict[str, Tensor]


@dataclass(kw_only=True)
class CAFeMeConfig:
    steps: int = 5              # S, inner personalisation steps per round (paper: 5)
    inner_lr: float = 0.05      # alpha
    outer_lr: float = 1e-3      # beta
    batch_size: int = 30        # paper: 30
    order: str = "first"        # first (authors' code) | second (through the inner steps)
    outer: str = "adam"         # adam (authors' code) | sgd (Alg. 1 line 8 as written)
    num_classes: int = 10


def split(omega: Omega) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    mu = {k[3:]: v for k, v in omega.items() if k.startswith("mu.")}
    psi = {k[4:]: v for k, v in omega.items() if k.startswith("psi.")}
    return mu, psi


def join(mu: dict[str, Tensor], psi: dict[str, Tensor]) -> Omega:
    return {f"mu.{k}": v for k, v in mu.items()} | {f"psi.{k}": v for k, v in psi.items()}


def loss(model: nn.Module, sites, psi: dict, x: Tensor, y: Tensor, zeta: Tensor | None) -> Tensor:
    with gated(model, sites, zeta):
        return F.cross_entropy(functional_call(model, psi, (x,)), y)


def adapt(model: nn.Module, sites, omega: Omega, x: Tensor, y: Tensor, steps: int, cfg: CAFeMeConfig,
          gen: torch.Generator, create_graph: bool = False) -> tuple[dict, dict, Tensor]:
    """Alg. 2: (mu', psi', zeta). With create_graph the result stays differentiable in omega."""
    model.train()
    w = dict(omega) if create_graph else {k: v.detach().requires_grad_(True) for k, v in omega.items()}
    for _ in range(steps):
        idx = random_batch(len(y), cfg.batch_size, gen, x.device)
        mu, psi = split(w)
        zeta = modulator(mu, x[idx], y[idx], cfg.num_classes)
        l = loss(model, sites, psi, x[idx], y[idx], zeta)
        grads = torch.autograd.grad(l, list(w.values()), create_graph=create_graph)
        w = {k: v - cfg.inner_lr * g for (k, v), g in zip(w.items(), grads)}
        if not create_graph:
            w = {k: v.detach().requires_grad_(True) for k, v in w.items()}
    mu, psi = split(w)
    return mu, psi, modulator(mu, x[idx], y[idx], cfg.num_classes)


def client_update(model: nn.Module, sites, omega: Omega, train: tuple[Tensor, Tensor], held_out: tuple[Tensor, Tensor],
                  cfg: CAFeMeConfig, gen: torch.Generator, moments: dict[str, Tensor] | None = None,
                  t: int = 1) -> tuple[Omega, float, dict[str, Tensor] | None]:
    """Alg. 1 lines 6-8: personalise on `train`, meta-gradient of the loss on `held_out`, one outer step.
    Returns (omega_i', held-out loss, the client's Adam moments when outer="adam")."""
    second = cfg.order == "second"
    leaves = {k: v.detach().requires_grad_(True) for k, v in omega.items()}
    mu, psi, zeta = adapt(model, sites, leaves, *train, cfg.steps, cfg, gen, create_graph=second)
    l = loss(model, sites, psi, *held_out, zeta)
    wrt = list(leaves.values()) if second else list(join(mu, psi).values())  # FO: gradient at omega' stands for it
    grads = dict(zip(leaves, torch.autograd.grad(l, wrt, allow_unused=True)))
    grads = {k: torch.zeros_like(v) if grads[k] is None else grads[k] for k, v in omega.items()}
    if cfg.outer == "adam":
        new, moments = adam_step(omega, grads, moments, t, cfg.outer_lr)
        new = {k: v.detach() for k, v in new.items()}
    else:
        new = {k: (v - cfg.outer_lr * grads[k]).detach() for k, v in omega.items()}
    return new, float(l.detach()), moments


@torch.no_grad()
def accuracy(model: nn.Module, sites, psi: dict, zeta: Tensor, x: Tensor, y: Tensor, batch_size: int) -> float:
    """Test accuracy of f_psi | zeta, BN on each test batch's statistics (batches of `batch_size`)."""
    model.train()
    chunks = list(torch.arange(len(y), device=y.device).split(batch_size))
    if len(chunks) > 1 and len(chunks[-1]) < 2:  # batch statistics need two samples
        chunks[-2] = torch.cat([chunks[-2], chunks.pop()])
    correct = y.new_zeros(())
    with gated(model, sites, zeta):
        for idx in chunks:
            correct += (functional_call(model, psi, (x[idx],)).argmax(1) == y[idx]).sum()
    return correct.item() / max(len(y), 1)  # one host read


def personalize_and_test(model: nn.Module, sites, omega: Omega, train: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor],
                         steps: int, cfg: CAFeMeConfig, gen: torch.Generator) -> float:
    """A client at test time (paper: 50 steps of Alg. 2 on its own data), then its test accuracy."""
    _, psi, zeta = adapt(model, sites, omega, *train, steps, cfg, gen)
    return accuracy(model, sites, {k: v.detach() for k, v in psi.items()}, zeta.detach(), *test, cfg.batch_size)
