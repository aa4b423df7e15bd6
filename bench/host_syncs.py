"""How often does batched FedL2P work read the device from the host? `python bench/host_syncs.py [--clients N]
[--personalize] [--json FILE]`.

Every read of a tensor's value into Python (`item`, `float`, `int`, `bool`, `tolist`, `numpy`) waits for the
device on a GPU: a host sync. On the CPU the same reads happen at the same places, so the count (unlike its cost) is
measured here as on a GPU. The script runs one batched client update (`client_update_many`, K = 2 iterations) for
FOMAML+ and the IFT on small-cnn clients and counts the reads per call site; `--personalize` counts a small
personalisation's instead, one client at a time and in groups of 4; `--json FILE` keeps the counts.
`tests/test_batched.py` holds both: one read per client update, one per prefetched set of clients.
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
    """One batched client update of `n` small-cnn clients (K = 2 iterations), its host reads counted."""
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
    from fedl2p_cli.configs import PRESETS
    paper_head = {k: v for k, v in PRESETS["fomaml"].items() if k in MetaConfig.__dataclass_fields__}  # init_lambda's
    cfg = MetaConfig(**paper_head | {"meta_grad": meta_grad, "iterations": 2, "epochs": 1, "batch_size": 16} | settings)
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


# reads of tensors a method recorded on the host (a strategy's key and its values for the results): on a GPU they read
# host memory and wait for nothing; on the CPU they cannot be told apart from device reads, so they are listed apart
HOST_SIDE = ("def strategy_key", "strategies.items()")
PERSONALIZE_METHODS = ["ft-bnc", "ft-bni", "ft-tuned", "fedl2p", "fedl2p-checked"]


def personalization(group: int) -> tuple[collections.Counter, int]:
    """`personalize` of a tiny digits-c federation's seen pool, two seeds, the methods above, batched in groups of
    `group` clients (1: one at a time), its host reads counted; and the number of (client, seed) pairs."""
    import tempfile

    from fedl2p_cli import plugins
    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.runtime import Runtime
    from fedl2p_cli.stages import meta_train, partition, personalize, pretrain, stats
    from fedl2p_cli.stages.interface import Inputs, StageContext, run_stage

    def run(module, cfg, parents, rt=None):  # this script is its own entry point: it hands its catalog over
        rt = (rt or Runtime()).replace(catalog=plugins.current())
        return run_stage(module, cfg, Inputs.given(parents), StageContext(store, rt))[0]
    store = Store(tempfile.mkdtemp(prefix="host-syncs-"))
    part = run(partition, partition.PartitionConfig(dataset="digits-c", clients=12, samples_per_client=40), {})
    pre = run(pretrain, pretrain.PretrainConfig(rounds=3, fraction=0.5, batch_size=16), {"partition": part.id})
    st = run(stats, stats.StatsConfig(), {"partition": part.id, "pretrain": pre.id})
    meta = run(meta_train, meta_train.MetaTrainConfig.preset("fomaml", rounds=2, fraction=0.5, epochs=1, batch_size=16,
                                                             base_lr=0.01), {"pretrain": pre.id, "stats": st.id})
    cfg = personalize.PersonalizeConfig(epochs=1, batch_size=16, base_lr=0.01, seeds=[0, 1], methods=PERSONALIZE_METHODS)
    rt = Runtime(engine="batched", client_batch=group) if group > 1 else Runtime()
    with host_reads() as counts:
        art = run(personalize, cfg, {"pretrain": pre.id, "stats": st.id, "meta": [meta.id]}, rt)
    return counts, len(personalize.load(store, art.id)[1].client) * 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=8, help="clients in the batched group")
    ap.add_argument("--json", type=Path, default=None, help="write the counts here")
    ap.add_argument("--personalize", action="store_true", help="count a personalisation's reads instead (groups of 1 and 4)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.personalize:
        return personalize_main(args.json)
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


def personalize_main(path: Path | None) -> None:
    out = {}
    for group in (1, 4):
        counts, pairs = personalization(group)
        host = sum(k for site, k in counts.items() if _host_side(site))
        out[f"group{group}"] = {"total": sum(counts.values()), "host_side": host, "client_seeds": pairs,
                                "device_per_client_seed": (sum(counts.values()) - host) / pairs, "sites": dict(counts.most_common())}
        print(f"personalize, groups of {group}: {sum(counts.values()) - host} device reads (+{host} host-side) for {pairs} "
              "client-seeds", file=sys.stderr)
        for site, k in counts.most_common():
            print(f"  {k:5d}  {site}{'  (host-side)' if _host_side(site) else ''}", file=sys.stderr)
    if path:
        path.write_text(json.dumps({"methods": PERSONALIZE_METHODS} | out, indent=1) + "\n")


def _host_side(site: str) -> bool:
    """Whether the read at `site` (path:line) is one of HOST_SIDE's: a mark on its line or the 4 lines above."""
    import linecache
    path, _, line = site.rpartition(":")
    if not line.isdigit():
        return False
    file = str(Path(__file__).resolve().parents[1] / "fedl2p_cli" / path)
    near = "".join(linecache.getline(file, i) for i in range(max(int(line) - 4, 1), int(line) + 1))
    return any(mark in near for mark in HOST_SIDE)


if __name__ == "__main__":
    main()
