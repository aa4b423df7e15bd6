"""How often does a batched FedL2P client round read the device from the host? `python bench/host_syncs.py [--clients N]`.

Every read of a tensor's value into Python (`item`, `float`, `int`, `bool`, `tolist`, `numpy`) waits for the
device on a GPU: a host sync. On the CPU the same reads happen at the same places, so the count (unlike its cost) is
measured here as on a GPU. The script runs one batched client update (`client_update_many`, K iterations) for FOMAML+
and the IFT on small-cnn clients and counts the reads per call site; `--json FILE` keeps the counts.
`tests/test_batched.py` holds the count per round under a bound.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

# `cpu()` is left out: on the CPU it cannot tell a tensor on the device from the host-side batch indices it copies
READS = ("item", "__float__", "__int__", "__bool__", "__index__", "tolist", "numpy")


@contextmanager
def host_reads() -> Iterator[collections.Counter]:
    """Count every read of a tensor's value into Python while inside, by the package's call site (file:line)."""
    counts: collections.Counter = collections.Counter()
    saved = {name: getattr(torch.Tensor, name) for name in READS}

    def wrap(name: str, fn):
        def read(self, *args, **kwargs):
            counts[_site()] += 1
            return fn(self, *args, **kwargs)
        return read

    for name, fn in saved.items():
        setattr(torch.Tensor, name, wrap(name, fn))
    try:
        yield counts
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)


def _site() -> str:
    """The innermost frame in fedl2p_cli (the read's caller in the package), as path:line."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "fedl2p_cli" in frame.filename:
            return f"{frame.filename.split('fedl2p_cli/')[-1]}:{frame.lineno}"
    return "elsewhere"


def client_round(meta_grad: str, n: int, **settings) -> collections.Counter:
    """One batched client update of `n` small-cnn clients (K = TINY_META's iterations), its host reads counted."""
    from fedl2p_cli.algorithms.fedl2p import client_update_many
    from fedl2p_cli.core.bn import bn_layers, index_bn_layers
    from fedl2p_cli.core.client import ClientData
    from fedl2p_cli.core.finetune import ClientBN
    from fedl2p_cli.core.metanets import init_lambda
    from fedl2p_cli.core.settings import MetaConfig
    from fedl2p_cli.models import zoo
    torch.manual_seed(0)
    model = index_bn_layers(zoo.small_cnn(1, 10, width=4))
    theta = {k: v.detach() for k, v in model.named_parameters()}
    bns = [b for _, b in bn_layers(model)]
    cfg = MetaConfig(meta_grad=meta_grad, iterations=2, epochs=1, batch_size=16, **settings)
    datas, bn0s, inputs = [], [], []
    for i in range(n):
        x, y = torch.randn(40 + 3 * i, 1, 12, 12), torch.randint(0, 10, (40 + 3 * i,))
        datas.append(ClientData((x, y), (x[:16], y[:16]), (x[:4], y[:4])))
        bn0s.append(ClientBN([b.running_mean.clone() for b in bns], [b.running_var.clone() for b in bns]))
        inputs.append((torch.rand(len(bns)), torch.rand(5)))
    lam = init_lambda(len(bns), 5, len(theta), cfg.base_lr, "both", 0)
    gens = [torch.Generator().manual_seed(i) for i in range(n)]
    with host_reads() as counts:
        client_update_many(model, theta, [lam] * n, inputs, bn0s, datas, cfg, gens)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=8, help="clients in the batched group")
    ap.add_argument("--json", type=Path, default=None, help="write the counts here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = {}
    for mg in ("fomaml", "ift"):
        counts = client_round(mg, args.clients)
        out[mg] = {"total": sum(counts.values()), "per_client": sum(counts.values()) / args.clients,
                   "sites": dict(counts.most_common())}
        print(f"{mg}: {out[mg]['total']} host reads for {args.clients} clients (2 iterations)", file=sys.stderr)
        for site, k in counts.most_common():
            print(f"  {k:5d}  {site}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"clients": args.clients, "iterations": 2} | out, indent=1) + "\n")


if __name__ == "__main__":
    main()
