"""Client statistics for the meta-nets (Alg. 1 lines 6-7, Eq. 3): layer-input moments and BN KL distances."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .bn import MixBN

EPS = 1e-5
STAT_LAYERS = (nn.Conv2d, nn.Linear, MixBN)


@dataclass
class Moments:
    """Count, mean and sum of squared deviations, merged by Chan et al.'s stable formula (float64)."""

    n: float
    mean: Tensor
    m2: Tensor

    @staticmethod
    def of(x: Tensor, dims: list[int] | None) -> Moments:
        """Moments over `dims` (None: all elements) in one fused var_mean pass."""
        x = x.detach()
        if dims is None:
            var, mean = torch.var_mean(x, correction=0)
            n = x.numel()
        else:
            var, mean = torch.var_mean(x, dim=dims, correction=0)
            n = x.numel() // mean.numel()
        return Moments(float(n), mean.double(), var.double() * n)

    def merge(self, o: Moments) -> Moments:
        n = self.n + o.n
        delta = o.mean - self.mean
        return Moments(n, self.mean + delta * (o.n / n), self.m2 + o.m2 + delta.pow(2) * (self.n * o.n / n))

    @property
    def var(self) -> Tensor:
        return self.m2 / self.n

    def pooled(self) -> Moments:
        """Per-channel moments -> moments of all elements (channels of equal count)."""
        c = self.mean.numel()
        mean = self.mean.mean()
        m2 = self.m2.sum() + (self.n * (self.mean - mean).pow(2)).sum()
        return Moments(self.n * c, mean, m2)

    def __getitem__(self, i: int) -> Moments:
        """One group's moments from grouped ([G, ...]) moments."""
        return Moments(self.n, self.mean[i], self.m2[i])


def stat_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every Conv, BN and Linear layer, in module (= forward) order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, STAT_LAYERS)]


@dataclass
class ClientStats:
    x: Tensor          # [2M]: E(x_0), SD(x_0), E(x_1), SD(x_1), ... (LRNet input)
    bn_mean: list[Tensor]  # per BN layer [J]
    bn_var: list[Tensor]
    xi: Tensor         # [B] symmetric KL per BN layer (BNNet input), forward order


@contextmanager
def _hooked_eval(model: nn.Module, make_hook: Callable[[int, bool], Callable]) -> Iterator[list[bool]]:
    """Eval mode with a forward pre-hook on every stat layer (hook gets its index and whether it is BN); yields the
    BN flags and restores hooks and mode afterwards."""
    layers = stat_layers(model)
    is_bn = [isinstance(m, MixBN) for _, m in layers]
    handles = [m.register_forward_pre_hook(make_hook(i, is_bn[i])) for i, (_, m) in enumerate(layers)]
    was_training = model.training
    model.eval()
    try:
        yield is_bn
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)


@torch.no_grad()
def layer_statistics(model: nn.Module, x: Tensor, batch_size: int = 512) -> tuple[list[Moments], list[Moments]]:
    """One eval-mode pass: moments of every stat layer's input (all elements) and BN inputs (per channel)."""
    acc: dict[int, Moments] = {}

    def hook(i: int, bn: bool) -> Callable[[nn.Module, tuple[Tensor, ...]], None]:
        def fn(_m: nn.Module, inp: tuple[Tensor, ...]) -> None:
            a = inp[0]
            mo = Moments.of(a, [0] + list(range(2, a.dim())) if bn else None)
            acc[i] = acc[i].merge(mo) if i in acc else mo
        return fn

    with _hooked_eval(model, hook) as is_bn:
        for s in range(0, len(x), batch_size):
            model(x[s:s + batch_size])
    return [acc[i].pooled() if b else acc[i] for i, b in enumerate(is_bn)], [acc[i] for i, b in enumerate(is_bn) if b]


@torch.no_grad()
def grouped_statistics(model: nn.Module, xs: list[Tensor]) -> list[tuple[list[Moments], list[Moments]]]:
    """`layer_statistics` of G clients of equal size n in one forward of the concatenated data: each hooked input is
    viewed as [G, n, ...] so every client's moments come from one fused reduction. One result per client."""
    g, n = len(xs), len(xs[0])
    acc: dict[int, Moments] = {}

    def hook(i: int, bn: bool) -> Callable[[nn.Module, tuple[Tensor, ...]], None]:
        def fn(_m: nn.Module, inp: tuple[Tensor, ...]) -> None:
            if bn:  # [G, n, C, H*W], a view: no copy of the activation
                a = inp[0].reshape(g, n, inp[0].shape[1], -1)
                var, mean = torch.var_mean(a, dim=(1, 3), correction=0)
                k = n * a.shape[3]
            else:
                a = inp[0].reshape(g, -1)
                var, mean = torch.var_mean(a, dim=1, correction=0)
                k = a.shape[1]
            acc[i] = Moments(float(k), mean.double(), var.double() * k)
        return fn

    with _hooked_eval(model, hook) as is_bn:
        model(torch.cat(xs))
    return [([acc[i][j].pooled() if b else acc[i][j] for i, b in enumerate(is_bn)],
             [acc[i][j] for i, b in enumerate(is_bn) if b]) for j in range(g)]


def kl_gauss(mu_p: Tensor, var_p: Tensor, mu_q: Tensor, var_q: Tensor) -> Tensor:
    """KL(N(mu_p, var_p) || N(mu_q, var_q)), elementwise."""
    return 0.5 * (torch.log(var_q / var_p) + (var_p + (mu_p - mu_q).pow(2)) / var_q - 1.0)


def sym_kl(mu_c: Tensor, var_c: Tensor, mu_pt: Tensor, var_pt: Tensor) -> Tensor:
    """Eq. 3: mean over channels of the symmetric KL, with sigma^2 = var + 1e-5."""
    vc, vp = var_c + EPS, var_pt + EPS
    return (0.5 * (kl_gauss(mu_c, vc, mu_pt, vp) + kl_gauss(mu_pt, vp, mu_c, vc))).mean()


def client_stats(model: nn.Module, x: Tensor, batch_size: int = 512) -> ClientStats:
    """The meta-nets' inputs for one client, from the pretrained model loaded into `model`."""
    return _finish(_bn_modules(model), *layer_statistics(model, x, batch_size))


def many_client_stats(model: nn.Module, xs: list[Tensor], batch_size: int = 512) -> list[ClientStats]:
    """`client_stats` for many clients; runs of equal-sized clients share forward passes of ~batch_size samples."""
    out: list[ClientStats] = []
    bns = _bn_modules(model)
    i = 0
    while i < len(xs):
        n = len(xs[i])
        g = 1
        while i + g < len(xs) and len(xs[i + g]) == n and (g + 1) * n <= batch_size:
            g += 1
        if g == 1:
            out.append(_finish(bns, *layer_statistics(model, xs[i], batch_size)))
        else:
            out += [_finish(bns, *r) for r in grouped_statistics(model, xs[i:i + g])]
        i += g
    return out


def _bn_modules(model: nn.Module) -> list[MixBN]:
    return [m for m in model.modules() if isinstance(m, MixBN)]


def _finish(bns: list[MixBN], per_layer: list[Moments], bn: list[Moments]) -> ClientStats:
    xs = torch.stack([torch.stack([m.mean, m.var.sqrt()]) for m in per_layer]).flatten()
    xi = torch.stack([sym_kl(c.mean, c.var, b.running_mean.double(), b.running_var.double()) for c, b in zip(bn, bns)])
    return ClientStats(xs.float(), [c.mean.float() for c in bn], [c.var.float() for c in bn], xi.float())
