"""FedBN (Li et al., ICLR 2021, Alg. 1) as pure functions over state dicts: a client's local update, the server's
aggregation and a new client's start. The nn.Module passed in is only a reusable workspace.

A model's state splits in two by module: the *local* part is every BatchNorm layer's affine parameters and running
statistics, which each client keeps; the *shared* part is everything else, which the server averages. The paper
averages uniformly over clients that all hold the same number of samples (Alg. 1: 1/K); this averages by sample
count, which is the same thing when sizes are equal and FedAvg's rule when they are not.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fedl2p_cli.api import LocalConfig, epochs_of_batches, get_state, is_batchnorm, mean_loss, set_state, sgd_client, weighted_average

State = dict[str, Tensor]


def local_keys(model: nn.Module) -> frozenset[str]:
    """State-dict keys of the model's BatchNorm layers (ours or torch's): what FedBN keeps on each client."""
    out = set()
    for name, m in model.named_modules():
        if is_batchnorm(m):
            prefix = f"{name}." if name else ""
            out |= {prefix + k for k in m.state_dict()}
    if not out:
        raise ValueError("FedBN needs a model with BatchNorm layers; this one has none")
    return frozenset(out)


def split(state: State, local: frozenset[str]) -> tuple[State, State]:
    """(shared, local) parts of a full state."""
    return {k: v for k, v in state.items() if k not in local}, {k: v for k, v in state.items() if k in local}


def client_update(model: nn.Module, shared: State, local: State, x: Tensor, y: Tensor, lr: float, cfg: LocalConfig,
                  gen: torch.Generator) -> tuple[State, float]:
    """One client's round (Alg. 1's inner loop): local SGD on every parameter of the model made of the server's shared
    part and the client's own BN layers; the whole new state and the mean training loss."""
    return sgd_client(model, shared | local, x, y, lr, cfg, gen)


def aggregate(results: list[tuple[State, int]], local: frozenset[str]) -> tuple[State, list[State]]:
    """The server's step: the sample-weighted average of the clients' shared parts, and each client's new local part
    (returned to it, never mixed with another client's)."""
    parts = [split(s, local) for s, _ in results]
    shared = weighted_average([p[0] for p in parts], [n for _, n in results])
    return shared, [p[1] for p in parts]


def mean_local(locals_: list[State], weights: list[float]) -> State:
    """The sample-weighted mean of the clients' BN layers: where a client FedBN never trained starts from."""
    return weighted_average(locals_, weights)


def bn_params(model: nn.Module, local: frozenset[str]) -> list[str]:
    return [n for n, _ in model.named_parameters() if n in local]


def adapt_bn(model: nn.Module, shared: State, local: State, x: Tensor, y: Tensor, lr: float, cfg: LocalConfig,
             gen: torch.Generator) -> tuple[State, float]:
    """A new client's FedBN model: the shared part is kept as the federation trained it; the client trains only its
    BN affine parameters (SGD, `cfg.epochs` epochs) and then estimates its BN statistics on its own train split.
    Returns its local part and the mean training loss."""
    keys = frozenset(local)
    set_state(model, shared | local).train()
    params = dict(model.named_parameters())
    names = bn_params(model, keys)
    losses = []
    for idx in epochs_of_batches(len(y), cfg.batch_size, gen, cfg.epochs, x.device):
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        grads = torch.autograd.grad(loss, [params[n] for n in names])
        with torch.no_grad():
            for n, g in zip(names, grads):
                params[n].sub_(lr * g)
        losses.append(loss.detach())
    estimate_bn_statistics(model, x, cfg.batch_size * 8)
    return split(get_state(model), keys)[1], mean_loss(losses)


@torch.no_grad()
def estimate_bn_statistics(model: nn.Module, x: Tensor, chunk: int) -> None:
    """Set every BN layer's running statistics to the client's own: a train-mode pass over `x` in chunks, the i-th
    chunk weighted 1/i (a cumulative mean over the chunks; one chunk gives exactly the data's statistics)."""
    bns = [m for m in model.modules() if is_batchnorm(m)]
    kept = [m.momentum for m in bns]
    model.train()
    for i, start in enumerate(range(0, len(x), chunk), start=1):
        if len(x) - start < 2 and i > 1:  # batch statistics need two samples
            break
        for m in bns:
            m.momentum = 1.0 / i
        model(x[start:start + chunk])
    for m, mom in zip(bns, kept):
        m.momentum = mom
    model.eval()


def state_of(shared: State, local: State) -> State:
    """A client's personalised model: the shared part and its own BN layers."""
    return shared | local

