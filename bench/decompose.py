"""Which half of a learned strategy helps: `python bench/decompose.py PERSONALIZE_ID [--beta B] [--eta-scales 0.5,2]
[--layer-betas 0,1] [--method M]`.
Runs `fedl2p analyze decompose` on the bench store (artifacts/ or $FEDL2P_STORE) and prints its report; the artifact
(analyze/ID: summary.md/json) keeps the result."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import accuracy  # noqa: E402  (the bench store)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("personalize", help="a personalize artifact id (with a learned method)")
    ap.add_argument("--beta", type=float, default=None, help="the fixed beta (default: the meta-train's beta_init)")
    ap.add_argument("--eta-scales", default="", help="comma-separated factors for the learned LRs")
    ap.add_argument("--layer-betas", default="", help="comma-separated betas set in one BN layer at a time")
    ap.add_argument("--method", default=None, help="the learned method (default: the personalisation's first)")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    from fedl2p_cli.artifacts import Store
    from fedl2p_cli.cli.render import RichProgress
    from fedl2p_cli.configs import DecomposeConfig
    from fedl2p_cli.errors import USER_ERRORS
    from fedl2p_cli.stages import decompose
    floats = lambda text: [float(v) for v in text.split(",") if v.strip()]  # noqa: E731
    cfg = DecomposeConfig(method=args.method, beta=args.beta, eta_scales=floats(args.eta_scales),
                          layer_betas=floats(args.layer_betas))
    try:
        art, _ = decompose.run(cfg, Store(accuracy.STORE), args.personalize, progress=RichProgress())
    except USER_ERRORS as e:  # a wrong id: one line, not a traceback
        sys.exit(f"error: {e}")
    print(f"analyze/{art.id}\n\n" + art.file("summary.md").read_text())


if __name__ == "__main__":
    main()
