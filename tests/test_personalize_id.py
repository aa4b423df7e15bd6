"""A personalisation's id does not depend on the order methods are given in, nor on whether a learned variant is named
in --methods (stage by stage) or given as its meta-train artifact (a pipeline): the same personalisation was computed
twice under two ids (issue 51)."""

from __future__ import annotations

import shutil

from fedl2p_cli.artifacts import Store
from fedl2p_cli.configs import PersonalizeConfig
from fedl2p_cli.stages import personalize

from .helpers import execute

BUDGET = dict(epochs=1, batch_size=16, base_lr=0.01, seeds=[0])


def test_method_order_and_naming_give_one_id(tiny_store, tmp_path):
    # a copy holding the tiny store's one meta-train run: its variant (the stable IFT, `fedl2p`) is also the method's
    # name, which means the newest FedL2P run of the model, whichever other tests have added to the shared store
    shutil.copytree(tiny_store["store"].root, tmp_path / "s")
    store, (pre, st, meta) = Store(tmp_path / "s"), (tiny_store[k] for k in ("pretrain", "stats", "meta"))
    for other in (tmp_path / "s" / "meta-train").iterdir():
        if other.is_dir() and other.name != meta.id:
            shutil.rmtree(other)
    variant = meta.metrics["variant"]
    # a pipeline: hand-made methods in its file, the learned one as its [[meta-train]] artifact
    piped, _ = execute(personalize, PersonalizeConfig(methods=["ft-bnc", "ft-bni"], **BUDGET), store,
                       {"pretrain": pre.id, "stats": st.id, "meta": [meta.id]})
    # stage by stage: the variant named, the methods in another order
    staged, reused = execute(personalize, PersonalizeConfig(methods=[variant, "ft-bni", "ft-bnc"], **BUDGET), store,
                             {"pretrain": pre.id, "stats": st.id})
    assert (staged.id, reused) == (piped.id, True)
    assert piped.config["methods"] == ["ft-bnc", "ft-bni"]


def test_a_pipelines_ordered_methods_keep_their_id(tiny_store):
    """The shipped pipelines list their hand-made methods in the registry's order: their config is unchanged."""
    store, pre, st, meta = (tiny_store[k] for k in ("store", "pretrain", "stats", "meta"))
    art, _ = execute(personalize, PersonalizeConfig(methods=["ft-bnc", "ft-bng", "ft-bni", "ft-tuned"], **BUDGET), store,
                     {"pretrain": pre.id, "stats": st.id, "meta": [meta.id]})
    assert art.config["methods"] == ["ft-bnc", "ft-bng", "ft-bni", "ft-tuned"]
