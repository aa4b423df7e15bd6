"""The authors' FedL2P client (royson/fedl2p) wired to our model and data: what `bench/reference.py` (accuracy) and
`bench/reference_speed.py` (speed) share. Their client builds its net, data and meta-nets from a config of class
paths; the classes named here hand it our architecture (with their KLD batch norm) and our client's tensors."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import torch.nn as nn

CLIENT = "src/apps/clients/fedl2p_classification_client.py"


def fail(msg: str) -> None:
    print(f"bench-reference: {msg}", file=sys.stderr)
    raise SystemExit(2)


def import_reference(ref: Path):
    """The authors' client module, or one line naming what is missing."""
    if not (ref / CLIENT).is_file():
        fail(f"--ref {ref}: no {CLIENT} there; give a clone of https://github.com/royson/fedl2p")
    os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")  # flwr 0.17's generated protobuf code
    sys.path.insert(0, str(ref))
    try:
        import src.apps.clients.fedl2p_classification_client as client
        from src.models import model_utils
    except ImportError as e:
        fail(f"the authors' code needs module '{e.name}', missing in {sys.prefix}; "
             "run `make bench-reference REF=...` (it builds .venv-ref) or pip install it")
    return client, model_utils


# --- our pieces, in the shapes their client asks its config for -----------------------------------------------------

class Shared:
    """What their client builds from its config: set once per cell, read by RefNet and RefData."""
    template = None     # our pretrained model with their KLD batch norm
    part = None         # our partition


class RefNet(nn.Module):
    """Their `models.net`: a module whose `.net` is our architecture with their KLDBatchNorm2d layers."""

    def __init__(self, device=None, **_):
        super().__init__()
        self.net = copy.deepcopy(Shared.template)
        if device is not None:
            self.to(device)

    def forward(self, x):
        return self.net(x)


class RefData:
    """Their `data` class: jit transforms (identity: our tensors are normalised, the bench augments nothing) and
    `get_dataloader` over our client's splits. Their fit asks for (train, val); our partition's val split is the val."""

    def __init__(self, ckp, **_):
        pass

    @staticmethod
    def jit_augment(x):
        return x

    jit_normalize = jit_augment

    def get_dataloader(self, data_pool, cid, partition, batch_size, num_workers=0, augment=False, shuffle=False,
                       val_ratio=None, seed=None, path=None):
        from torch.utils.data import DataLoader, TensorDataset
        d = Shared.part.client(int(cid))
        load = lambda split, sh: DataLoader(TensorDataset(*split), batch_size=int(batch_size), shuffle=sh)
        if partition == "test":
            return load(d.test, False)
        if data_pool == "train" and val_ratio is not None:
            return load(d.train, shuffle), load(d.val, False)
        return load(d.train, shuffle)


def reference_config(cfg: dict, rounds: int, weights: Path, optimizer: str = "torch.optim.SGD"):
    """Their configs/cifar10/cifar_fedl2p.yaml, with the cell's rounds, e, base LR and our net and data (`optimizer`:
    the meta-nets' optimizer class, SGD as in their configs; the speed bench names a subclass that notes its steps)."""
    from config import AttrDict
    meta_net = lambda cls, bias, args: {"class": cls, "mode": "layerwise", "args": args,
                                        "optimizer": {"class": optimizer, "args": {}},
                                        "init": {"gain_init": 0.1, "bias_init": bias}}
    return AttrDict({
        "seed": 0,
        "models": {"net": {"class": f"{__name__}.RefNet", "args": {}},
                   "bn_net": meta_net("src.models.BNNet", 0.5, {}),
                   "lr_net": meta_net("src.models.ClampLRNet", 1.0, {"max_limit": 1000.0})},
        "data": {"class": f"{__name__}.RefData", "args": {}},
        "app": {"args": {"load_model": str(weights)}, "run": {"num_rounds": rounds},
                "on_fit": {"start_inner_lr": cfg["base_lr"]}},
    })


def client_kwargs(cfg: dict, rounds: int, meta_algorithm: str = "IFT") -> dict:
    from config import AttrDict
    return dict(batch_size=cfg["batch_size"], outer_loop_epochs=cfg["iterations"], inner_loop_epochs=cfg["epochs"],
                meta_algorithm=meta_algorithm, augment_validation=False, clamp_outer_gradients=1.0,
                meta_nets_rounds={"bn_net": rounds, "lr_net": rounds}, learnable_lrs=True,
                hypergrad=AttrDict({"class": "src.apps.clients.client_utils.Hypergrad",
                                    "args": {"learning_rate": 0.1, "truncate_iter": 3}}))


def their_model(our_model, model_utils, native_conv: bool = False):
    """Our pretrained model with each of its BN layers replaced by their KLDBatchNorm2d (weights and statistics).
    native_conv: our convolutions (core/conv.py's hand-written double backward) and max-pools (core/pool.py's
    channels-last kernel) become plain nn.Conv2d and nn.MaxPool2d, as in their own models (the speed bench; the
    accuracy bench keeps ours, as when its results were recorded)."""
    from fedl2p_cli.core.bn import MixBN
    from fedl2p_cli.core.conv import Conv2d
    from fedl2p_cli.core.pool import MaxPool2d
    m = copy.deepcopy(our_model)
    for parent in m.modules():
        if native_conv and type(parent) is Conv2d:
            parent.__class__ = nn.Conv2d  # same parameters and state-dict keys (core.conv.Conv2d subclasses it)
        if native_conv and type(parent) is MaxPool2d:
            parent.__class__ = nn.MaxPool2d  # their models pool with torch's own module
        for name, child in parent.named_children():
            if isinstance(child, (MixBN, nn.BatchNorm2d)):
                setattr(parent, name, model_utils.KLDBatchNorm2d(child.num_features, eps=child.eps))
    return m


def logit_gap(our_model, state: dict, client_mod, model_utils, x) -> float:
    """Max |logit difference| between our pretrained model and theirs (pretrained statistics, eval mode)."""
    import torch
    net = RefNet()
    model_utils.copy_pretrain_to_kld({k: v for k, v in state.items()}, net)
    model_utils.set_kld_bn_mode(net, True)
    with torch.no_grad():
        return float((our_model.eval()(x) - net.eval()(x)).abs().max())
