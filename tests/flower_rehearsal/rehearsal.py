"""The rehearsal ClientApp (tests only): the production ClientApp, except that a site started with node-config
`fault` spoils its train replies on purpose, so that a loopback federation exercises the server's defences."""

from __future__ import annotations

from dataclasses import replace

import torch

from fedl2p_cli.flower.app import build_client_app

FAULTS = ("nan", "shape", "scale100")


def misbehave(done, lam: dict, node_config) -> object:
    """nan = non-finite learning rates, shape = a meta-net weight of the wrong shape, scale100 = an update 100 times
    the site's real one; no `fault`: the reply as computed."""
    fault, r = node_config.get("fault"), done.result
    if fault is None or r is None:  # an honest site, or a diverged client's message: nothing to spoil
        return done
    if fault == "nan":
        new = dict(r.lam, eta=torch.full_like(r.lam["eta"], float("nan")))
    elif fault == "shape":
        k = next(k for k, v in r.lam.items() if v.dim() == 2)
        new = dict(r.lam, **{k: r.lam[k][:, :1].contiguous()})
    elif fault == "scale100":
        new = {k: lam[k] + 100.0 * (v - lam[k]) for k, v in r.lam.items()}
    else:
        raise ValueError(f"unknown node-config fault '{fault}'; choose one of: {', '.join(FAULTS)}")
    return replace(done, result=replace(r, lam=new))


client_app = build_client_app(misbehave)
