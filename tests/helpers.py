"""Small fixtures shared by tests: a smooth float64 model, client data and statistics."""

from __future__ import annotations

from typing import Any

import torch

from fedl2p_cli import plugins
from fedl2p_cli.core.finetune import ClientBN
from fedl2p_cli.core.metanets import hyperparameters, init_lambda
from fedl2p_cli.core.settings import MetaConfig
from fedl2p_cli.core.stats import client_stats
from fedl2p_cli.models.registry import build


def handed(runtime=None, **fields):
    """A runtime carrying a catalog, as a command hands one over: `runtime` (default: Runtime(**fields)) with its own
    catalog, else this test's context's (`plugins.current()`: a test is its own entry point)."""
    from fedl2p_cli.runtime import Runtime
    rt = runtime or Runtime(**fields)
    return rt if rt.catalog is not None else rt.replace(catalog=plugins.current())


def execute(module, cfg, store, parents: dict | None = None, force: bool = False, runtime=None, **ctx):
    """A stage run through its interface, as a command makes it: parent ids by name (an id, a list of them, or None:
    the stage's default), the runtime with its catalog handed over, and the rest of the context (progress, resume,
    plot)."""
    from fedl2p_cli.stages.interface import Inputs, StageContext, run_stage
    return run_stage(module, cfg, Inputs.given(parents or {}), StageContext(store, handed(runtime), force, **ctx))


def detached_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A model's parameters, detached copies by name."""
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def smooth_setup(n: int = 24, classes: int = 3, seed: int = 0, noisy: bool = False):
    """tiny-smooth model in float64 with BN buffers set away from 0/1, data, stats and a lambda."""
    torch.manual_seed(seed)
    model = build("tiny-smooth", 1, classes, seed=seed, catalog=plugins.current()).double()
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "running_mean"):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 1.5)
    x = torch.randn(n, 1, 8, 8, dtype=torch.float64)
    y = torch.randint(0, classes, (n,)) if noisy else (x.mean(dim=(1, 2, 3)) > 0).long() + (x[:, 0, 0, 0] > 1).long()
    st = client_stats(model, x)
    xi, xs = st.xi.double(), st.x.double()
    bn = ClientBN([m.double() for m in st.bn_mean], [v.double() for v in st.bn_var])
    theta = {k: v.double() for k, v in detached_params(model).items()}
    n_p = len(theta)
    lam = {k: v.double() for k, v in init_lambda(len(st.xi), len(st.x), n_p, 0.05, "both", seed).items()}
    # perturb lambda so beta and eta differ per layer (the init makes them nearly constant)
    g = torch.Generator().manual_seed(seed + 1)
    lam = {k: v + 0.01 * torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in lam.items()}
    lam["bnnet.2.bias"] = lam["bnnet.2.bias"] + torch.linspace(-0.3, 0.3, lam["bnnet.2.bias"].numel(), dtype=torch.float64)
    lam["lrnet.2.bias"] = lam["lrnet.2.bias"] + torch.linspace(-0.5, 0.5, lam["lrnet.2.bias"].numel(), dtype=torch.float64)

    def hyper(l):
        return hyperparameters(l, xi, xs, n_p, 0.05, 0.5)

    beta, eta = hyper(lam)
    assert beta.min() > 0.05 and beta.max() < 0.95 and eta.min() > 0  # inside the clamps: STE = true derivative
    return model, theta, lam, hyper, (x, y), bn


class Killed(Exception):
    """Raised by KillAfter to simulate a crash between rounds."""


class KillAfter:
    """A progress reporter that 'kills' the run once n rounds are done (their checkpoints are written)."""

    def __init__(self, n: int):
        self.n, self.done = n, 0

    def start(self, *a):
        pass

    def advance(self, n: int = 1, **info):
        self.done += n
        if self.done == self.n:
            raise Killed()

    def stop(self):
        pass


def tiny_client(tiny_store):
    """The tiny store's first seen client, ready for one client update: (model, theta_g, initial lambda, (xi, x),
    its stored BN statistics, the partition, the client id)."""
    from fedl2p_cli.stages import partition, pretrain, stats
    store = tiny_store["store"]
    _, part = partition.load(store, tiny_store["partition"].id)
    _, model, state = pretrain.load(store, tiny_store["pretrain"].id, plugins.current())
    _, table = stats.load(store, tiny_store["stats"].id)
    c = part.pool(False)[0]
    theta = {n: state[n] for n, _ in model.named_parameters()}
    lam = init_lambda(table.xi.shape[1], table.x.shape[1], len(theta), 0.01, "both", 0)
    return model, theta, lam, table.inputs(c), table.client_bn(c), part, c


def old_meta(**kw: Any) -> MetaConfig:
    """The client update's settings as the defaults were before the learn preset (`--preset fomaml`'s MetaConfig
    keys), `kw` over them: what these tests were written against."""
    from fedl2p_cli.configs import meta_of
    return meta_of("fomaml", **kw)
