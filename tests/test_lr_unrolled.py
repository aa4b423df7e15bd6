"""--lr-grad unrolled: the LRs' meta-gradient through every fine-tuning step, checked per tensor against finite
differences of the whole fine-tuning (the client's statistics recomputed on both sides) at a TRAINED lambda, where
the trajectory estimates have no guarantee; and the same one client at a time and batched."""

from __future__ import annotations

import dataclasses
import math

import torch

from fedl2p_cli.algorithms import meta_grads
from fedl2p_cli.algorithms.fedl2p import client_update
from fedl2p_cli.core.finetune import Strategy, finetune

from .test_batched import both_ways, close, setup  # noqa: F401, F811 (setup: the ragged group fixture)
from .test_log_head import LogClient, _val_loss


def _trained(c: LogClient) -> LogClient:
    """The client's lambda after 4 meta-iterations of its own update at large meta LRs: a strategy no longer the
    initial one (per-tensor LRs apart, beta moved)."""
    cfg = dataclasses.replace(c.cfg, iterations=4, lr_logeta=2.0, lr_bnnet=2.0, lr_lrnet=2.0)
    xi, xs = torch.zeros(len(c.bn0.mean), dtype=torch.float64), torch.zeros(2 * len(c.theta), dtype=torch.float64)
    res = client_update(c.model, c.theta, c.lam, xi, xs, c.bn0, c.data, cfg, torch.Generator().manual_seed(1),
                        entry=meta_grads.builtin("fomaml", "unrolled"))
    return dataclasses.replace(c, lam=res.lam)


def _loss(c: LogClient, eta: torch.Tensor) -> float:
    with torch.no_grad():
        beta, _ = c.hyper(c.lam)
    s = Strategy(beta, eta)
    x, y = c.data.train
    ft = finetune(c.model, c.theta, x, y, s, c.bn0, c.cfg.epochs, c.cfg.batch_size, torch.Generator().manual_seed(3),
                  c.cfg.client_bn)
    return _val_loss(c.model, ft.params, s, ft.bn, *c.data.val)  # its own recomputed statistics


def test_the_unrolled_lr_gradient_matches_finite_differences_per_tensor_at_a_trained_lambda():
    c = _trained(LogClient.make("unrolled"))
    init = LogClient.make("unrolled")
    with torch.no_grad():
        eta, eta0 = c.hyper(c.lam)[1], init.hyper(init.lam)[1]
    assert float((eta / eta0).log().abs().max()) > 0.1  # trained: the LRs moved away from the initial ones
    _, ft = c.tune(1.0)
    mg = meta_grads.builtin("fomaml", "unrolled").one(c.model, ft, c.lam, c.hyper, c.data, c.cfg,
                                                     torch.Generator().manual_seed(4))
    est = mg.grads["logeta"]  # dL_V/dlog eta_k, the code path meta-train runs
    h = 1e-4
    fd = torch.zeros_like(est)
    for k in range(len(eta)):
        up, down = eta.clone(), eta.clone()
        up[k], down[k] = eta[k] * math.exp(h), eta[k] * math.exp(-h)
        fd[k] = (_loss(c, up) - _loss(c, down)) / (2 * h)
    assert float(fd.abs().max()) > 1e-3
    assert torch.allclose(est, fd, rtol=1e-3, atol=1e-5 * float(fd.abs().max())), (est, fd)
    assert float(torch.nn.functional.cosine_similarity(est, fd, dim=0)) > 0.9999


def test_the_unrolled_lr_gradient_is_the_same_batched(setup):  # noqa: F811 (the fixture)
    """A group's update under the unrolled slopes (batched fine-tuning, its replay per client) equals one client at a
    time's (`client_update` and `client_update_many`, through test_batched's `both_ways`)."""
    lam, one, many = both_ways(setup, meta_grad="fomaml", iterations=2, head="log", lr_grad="unrolled")
    for a, b in zip(one, many):
        assert all(close(a.lam[k], b.lam[k], 1e-4) for k in lam)
    assert any(not torch.allclose(a.lam["logeta"], lam["logeta"]) for a in one)
