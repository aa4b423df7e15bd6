"""A personalisation's id does not depend on the order methods are given in, nor on whether a learned variant is named
in --methods (stage by stage) or given as its meta-train artifact (a pipeline): the same personalisation was computed
twice under two ids (issue 51)."""

from __future__ import annotations

from fedl2p_cli.configs import PersonalizeConfig
from fedl2p_cli.stages import personalize

BUDGET = dict(epochs=1, batch_size=16, base_lr=0.01, seeds=[0])


def test_method_order_and_naming_give_one_id(tiny_store):
    store, pre, st, meta = (tiny_store[k] for k in ("store", "pretrain", "stats", "meta"))
    variant = meta.metrics["variant"]
    # a pipeline: hand-made methods in its file, the learned one as its [[meta-train]] artifact
    piped, _ = personalize.run(PersonalizeConfig(methods=["ft-bnc", "ft-bni"], **BUDGET), store, pre.id, st.id, [meta.id])
    # stage by stage: the variant named, the methods in another order
    staged, reused = personalize.run(PersonalizeConfig(methods=[variant, "ft-bni", "ft-bnc"], **BUDGET), store, pre.id,
                                     st.id)
    assert (staged.id, reused) == (piped.id, True)
    assert piped.config["methods"] == ["ft-bnc", "ft-bni"]


def test_a_pipelines_ordered_methods_keep_their_id(tiny_store):
    """The shipped pipelines list their hand-made methods in the registry's order: their config is unchanged."""
    store, pre, st, meta = (tiny_store[k] for k in ("store", "pretrain", "stats", "meta"))
    art, _ = personalize.run(PersonalizeConfig(methods=["ft-bnc", "ft-bng", "ft-bni", "ft-tuned"], **BUDGET), store,
                             pre.id, st.id, [meta.id])
    assert art.config["methods"] == ["ft-bnc", "ft-bng", "ft-bni", "ft-tuned"]
