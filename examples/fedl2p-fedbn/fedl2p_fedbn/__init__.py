"""fedl2p-fedbn: an example fedl2p plugin. Installing it (`pip install examples/fedl2p-fedbn`) adds, through its
`fedl2p.plugins` entry point:

- the pFL system `fedbn` (FedBN, Li et al., ICLR 2021): `fedl2p pfl-train --algo fedbn`, `personalize --methods fedbn`;
- the hand-made method `ft-bn-only`: fine-tune only the BN layers' scale and shift, with the client's statistics;
- the model `mobilenet-v3-small` (torchvision's, no pretrained weights);
- the dataset `npz`: a user's arrays x, y[, domain] in a .npz file (`fedl2p partition --dataset npz --data-dir F.npz`).
"""

from __future__ import annotations

from pathlib import Path

FEDL2P_API = 1  # the fedl2p_cli.api version this plugin is written for


def bn_tensors(model) -> list[str]:
    """The BN layers' scale and shift: what `ft-bn-only` fine-tunes (and what FedBN keeps on each client)."""
    from .fedbn import local_keys
    keys = local_keys(model)
    return [n for n, _ in model.named_parameters() if n in keys]


def load_dataset(cfg, data_dir: Path | None):
    from .npz import load_npz
    return load_npz(data_dir)


def register(registry) -> None:
    """Called once per process by fedl2p's plugin loader (the CLI, worker processes, Flower sites)."""
    from fedl2p_cli.api import HandMade, Source, System

    from .model import mobilenet_v3_small

    registry.add_model("mobilenet-v3-small", mobilenet_v3_small, "torchvision MobileNetV3-small, no pretrained weights "
                       "(fedl2p-fedbn)", head="classifier.3")
    registry.add_dataset(Source("npz", load_dataset, "your arrays x, y[, domain] in the .npz file --data-dir names "
                                "(fedl2p-fedbn)"))
    registry.add_method(HandMade("ft-bn-only", "FT BN-only (BN C)", beta=1.0, baseline=False, tensors=bn_tensors))
    registry.add_system(System("fedbn", "FedBN", trainer="fedl2p_fedbn.system:FedBN"))
