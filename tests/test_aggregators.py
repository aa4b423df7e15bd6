"""--aggregate: how the server combines a round's replies, a catalog kind. `equal-norm` rescales every client's change
to the round's median change norm before the mean (a client with a ten times smaller change pulls as hard); the
paper's `mean` and the robust rules keep their ids; a plugin's aggregator is one registration through the same
catalog and the same loop."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from fedl2p_cli import plugins
from fedl2p_cli.artifacts import Store
from fedl2p_cli.catalog import AGGREGATOR, UnknownName
from fedl2p_cli.core.aggregate import equal_norm_average, robust_average
from fedl2p_cli.stages import meta_train
from fedl2p_cli.stages.common import config_dict

from .conftest import TINY_META
from .test_meta_signal import _run


def test_equal_norm_gives_every_client_the_median_change():
    sent = {"w": torch.zeros(2), "b": torch.ones(1)}
    loud = {"w": torch.tensor([10.0, 0.0]), "b": torch.ones(1)}      # change norm 10
    quiet = {"w": torch.tensor([0.0, 1.0]), "b": torch.ones(1)}      # change norm 1
    mid = {"w": torch.tensor([0.0, -3.0]), "b": torch.tensor([5.0])}  # change norm 5
    out = equal_norm_average(sent, [loud, quiet, mid], [1.0, 1.0, 1.0])
    # each change rescaled to norm 5: loud (5, 0, 0), quiet (0, 5, 0), mid (0, -3, 4); their mean
    assert torch.allclose(out["w"], torch.tensor([5 / 3, 2 / 3]))
    assert torch.allclose(out["b"], torch.tensor([1 + 4 / 3]))
    plain = robust_average([loud, quiet, mid], [1.0] * 3, "mean")
    assert torch.allclose(plain["w"], torch.tensor([10 / 3, -2 / 3]))  # the paper's mean: loud's change is twice as large
    weighted = equal_norm_average(sent, [loud, quiet], [3.0, 1.0])  # median of (10, 1) is 5.5
    assert torch.allclose(weighted["w"], torch.tensor([0.75 * 5.5, 0.25 * 5.5]))
    still = equal_norm_average(sent, [sent, quiet, quiet], [1.0] * 3)  # a client that did not move: a zero change
    assert torch.allclose(still["w"], torch.tensor([0.0, 2 / 3]))
    # per tensor: w's changes (norms 10, 1, 3) to 3 each, b's (0, 0, 4) to the median 0: b stays
    each = equal_norm_average(sent, [loud, quiet, mid], [1.0] * 3, per_tensor=True)
    assert torch.allclose(each["w"], torch.tensor([1.0, 0.0])) and torch.equal(each["b"], sent["b"])


def test_the_catalog_holds_the_rules_and_names_them_on_a_typo():
    cat = plugins.build()
    assert {"mean", "median", "trimmed-mean", "equal-norm", "equal-norm-tensor"} <= set(cat.names(AGGREGATOR))
    with pytest.raises(UnknownName, match="equal-norm"):
        cat.get(AGGREGATOR, "equal_norm")


@dataclasses.dataclass(frozen=True)
class First:
    """A test's aggregator: the first reply as it is."""
    name: str = "first"
    about: str = "a test's aggregator"
    calls: list = dataclasses.field(default_factory=list, compare=False)

    def combine(self, sent, lams, weights):
        self.calls.append(len(lams))
        return lams[0]


def test_equal_norm_names_its_variant_the_mean_keeps_ids_and_a_plugin_rides_the_same_loop(tiny_store, tmp_path):
    shutil.copytree(tiny_store["store"].root, tmp_path / "s")
    store = Store(tmp_path / "s")
    meta = dataclasses.replace(TINY_META, meta_grad="fomaml", head="log", lr_grad="trajectory")
    base = meta_train.MetaTrainConfig.preset("fomaml", rounds=1, fraction=0.5, keep="last", meta=meta)
    assert "aggregator" not in config_dict(base)  # the paper's mean: ids made before the option stay
    fair = dataclasses.replace(base, aggregator="equal-norm")
    assert "eqnorm" in fair.variant().split("-")
    assert dataclasses.replace(base, aggregator="trimmed-mean").variant().endswith("-trim")
    art, lam_fair = _run(store, fair, tiny=tiny_store)
    _, lam_mean = _run(store, base, tiny=tiny_store)
    assert any(not torch.allclose(lam_fair[k], lam_mean[k]) for k in lam_fair)  # the rule changed the step
    assert art.manifest["config"]["aggregator"] == "equal-norm"

    entry = First()
    catalog = plugins.build(lambda r: r.add_aggregator(entry))
    mine, _ = _run(store, dataclasses.replace(base, aggregator="first"), catalog=catalog, tiny=tiny_store)
    assert entry.calls == [4] and "first" in mine.metrics["variant"].split("-") and mine.manifest.get("plugins")
