"""CAFeMe's federated modulator and feature-wise sigmoid gating (Vettoruzzo et al., SDM 2024, Sec. 4.1, Eq. 4.4).

The modulator g_mu reads a batch (images and one-hot labels), maps each example through a small conv feature
extractor h_x and a linear layer h, averages over the batch (a permutation-invariant client context z_i) and an
MLP turns z_i into zeta = {zeta^l}, one vector per gate site of the base model. The base model's output at each
site is multiplied channel-wise by sigmoid(zeta^l). Sites: every residual block of a ResNet, otherwise every
hidden activation (the small CNN's three conv-BN-ReLU blocks). Sizes (ours; the paper's are for its own CNNs):
h_x = conv3x3(16)-ReLU-maxpool-conv3x3(32)-ReLU-global-average, h = linear to 100 + ReLU, MLP 100 -> 200 -> sites.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import mlp
from .pool import max_pool2d

Mod = dict[str, Tensor]
ACTIVATIONS = (nn.ReLU, nn.Softplus, nn.GELU, nn.SiLU, nn.Tanh)
WIDTHS = (16, 32)
HIDDEN = (100, 200)


def gate_sites(model: nn.Module, in_channels: int, size: int = 32) -> list[tuple[str, int]]:
    """(module name, channels) of every gate site, found by one probe forward in eval mode."""
    blocks = [n for n, m in model.named_modules() if type(m).__name__ in ("BasicBlock", "Bottleneck")]
    names = blocks or [n for n, m in model.named_modules() if isinstance(m, ACTIVATIONS)]
    found: dict[str, int] = {}
    mods = dict(model.named_modules())

    def record(n: str) -> Callable[[nn.Module, tuple[Tensor, ...], Tensor], None]:
        def hook(m: nn.Module, i: tuple[Tensor, ...], o: Tensor) -> None:  # returns None: the output is left as it is
            found.setdefault(n, o.shape[1])
        return hook

    hooks = [mods[n].register_forward_hook(record(n)) for n in names]
    was = model.training
    try:
        with torch.no_grad():
            p = next(model.parameters())
            model.eval()(p.new_zeros(1, in_channels, size, size))
    finally:
        model.train(was)
        for h in hooks:
            h.remove()
    return [(n, found[n]) for n in names if n in found]


@contextmanager
def gated(model: nn.Module, sites: list[tuple[str, int]], zeta: Tensor | None) -> Iterator[None]:
    """Within the block, the output of each site is multiplied by sigmoid(zeta^l) over its channels (Eq. 4.4).
    zeta: [sum of site channels]; None leaves the model as it is."""
    if zeta is None:
        yield
        return
    gates = torch.sigmoid(zeta).split([c for _, c in sites])  # type: ignore[no-untyped-call]  # torch leaves Tensor.split unannotated
    mods = dict(model.named_modules())

    def hook(g: Tensor) -> Callable[[nn.Module, tuple[Tensor, ...], Tensor], Tensor]:
        return lambda m, i, o: o * g.view(1, -1, *([1] * (o.dim() - 2)))

    handles = [mods[n].register_forward_hook(hook(g)) for (n, _), g in zip(sites, gates)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _uniform(shape: tuple[int, ...], fan_in: int, gen: torch.Generator) -> Tensor:
    bound = 1.0 / math.sqrt(fan_in)
    return (torch.rand(shape, generator=gen, device=gen.device) * 2 - 1) * bound


def init_modulator(in_channels: int, num_classes: int, out_dim: int, gen: torch.Generator) -> Mod:
    """Weights in torch's default ranges (uniform +-1/sqrt(fan_in)); output bias 0, so initial gates are ~0.5."""
    mod: Mod = {}
    c_in = in_channels
    for i, c in enumerate(WIDTHS):
        mod[f"conv{i}.weight"] = _uniform((c, c_in, 3, 3), c_in * 9, gen)
        mod[f"conv{i}.bias"] = _uniform((c,), c_in * 9, gen)
        c_in = c
    dims = [WIDTHS[-1] + num_classes, *HIDDEN, out_dim]
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        mod[f"fc{i}.weight"] = _uniform((b, a), a, gen)
        mod[f"fc{i}.bias"] = _uniform((b,), a, gen) if i < len(dims) - 2 else torch.zeros(b, device=gen.device)
    return mod


def modulator(mod: Mod, x: Tensor, y: Tensor, num_classes: int) -> Tensor:
    """zeta = g_mu(batch): per-example features of (x, one-hot y), mean over the batch, MLP."""
    h = x
    for i in range(len(WIDTHS)):
        h = F.relu(F.conv2d(h, mod[f"conv{i}.weight"], mod[f"conv{i}.bias"], padding=1))
        if i < len(WIDTHS) - 1:
            h = max_pool2d(h, 2)
    h = torch.cat([h.mean((2, 3)), F.one_hot(y, num_classes).to(h.dtype)], 1)
    h = F.relu(F.linear(h, mod["fc0.weight"], mod["fc0.bias"]))
    z = h.mean(0)  # the permutation-invariant client context
    n = sum(1 for k in mod if k.startswith("fc") and k.endswith(".weight"))
    head = {f"{i - 1}.{w}": mod[f"fc{i}.{w}"] for i in range(1, n) for w in ("weight", "bias")}  # fc1.. -> the MLP's 0..
    return mlp.run(head, z)
