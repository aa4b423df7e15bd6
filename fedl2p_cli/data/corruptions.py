"""Generated feature-shift domains (CIFAR-10-C style) for small grayscale/colour images.

Vectorised over a uint8 batch and deterministic for a given generator. Severities 1..5; the constants
are milder than ImageNet-C's, which are too harsh at 32 px.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torchvision.transforms.v2 import functional as TF

from ..errors import DataError

Corruption = Callable[[torch.Tensor, int, torch.Generator], torch.Tensor]


def _f(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32) / 255.0


def _u8(x: torch.Tensor) -> torch.Tensor:
    return (x.clamp(0, 1) * 255.0).round().to(torch.uint8)


def gaussian_noise(x, s, g):
    sigma = [0.06, 0.10, 0.15, 0.22, 0.30][s - 1]
    return _u8(_f(x) + sigma * torch.randn(x.shape, generator=g))


def impulse_noise(x, s, g):
    p = [0.02, 0.05, 0.08, 0.12, 0.18][s - 1]
    u = torch.rand(x.shape, generator=g)
    y = x.clone()
    y[u < p / 2] = 0
    y[(u >= p / 2) & (u < p)] = 255
    return y


def gaussian_blur(x, s, g):
    sigma = [0.6, 0.9, 1.2, 1.6, 2.0][s - 1]
    return TF.gaussian_blur(x, kernel_size=[7, 7], sigma=[sigma, sigma])


def contrast(x, s, g):
    c = [0.6, 0.45, 0.3, 0.2, 0.12][s - 1]
    f = _f(x)
    m = f.mean(dim=(1, 2, 3), keepdim=True)
    return _u8((f - m) * c + m)


def brightness(x, s, g):
    b = [0.1, 0.2, 0.3, 0.4, 0.5][s - 1]
    return _u8(_f(x) + b)


def invert(x, s, g):
    return 255 - x


def pixelate(x, s, g):
    k = [0.8, 0.6, 0.5, 0.4, 0.3][s - 1]
    h, w = x.shape[-2:]
    small = torch.nn.functional.interpolate(_f(x), size=(max(2, int(h * k)), max(2, int(w * k))), mode="area")
    return _u8(torch.nn.functional.interpolate(small, size=(h, w), mode="nearest"))


CORRUPTIONS: dict[str, Corruption] = {
    "clean": lambda x, s, g: x,
    "gaussian_noise": gaussian_noise,
    "impulse_noise": impulse_noise,
    "gaussian_blur": gaussian_blur,
    "contrast": contrast,
    "brightness": brightness,
    "invert": invert,
    "pixelate": pixelate,
}
DEFAULT_DOMAINS = ["clean", "gaussian_noise", "gaussian_blur", "contrast", "brightness", "invert", "pixelate"]


ROTATION_DOMAINS = [f"rotate{a}" for a in range(0, 200, 20)]  # RMNIST's 10 angles in [0, 200) (CAFeMe App. 8.1)


def rotation(name: str) -> float | None:
    """The angle of a `rotate<degrees>` domain (a rotation-domain "corruption"), else None."""
    if not name.startswith("rotate"):
        return None
    try:
        return float(name[len("rotate"):])
    except ValueError:
        return None


def check(names: list[str], severity: int) -> None:
    bad = [n for n in names if n not in CORRUPTIONS and rotation(n) is None]
    if bad:
        raise DataError(f"unknown corruption '{bad[0]}'; choose from: {', '.join(CORRUPTIONS)}, rotate<degrees>")
    if not 1 <= severity <= 5:
        raise DataError(f"--severity must be 1..5, got {severity}")


def apply(name: str, images: torch.Tensor, severity: int, seed: int) -> torch.Tensor:
    angle = rotation(name)
    if angle is not None:  # severity does not apply: the angle is the domain
        return TF.rotate(images, angle, interpolation=TF.InterpolationMode.BILINEAR)
    g = torch.Generator().manual_seed(seed)
    return CORRUPTIONS[name](images, severity, g)
