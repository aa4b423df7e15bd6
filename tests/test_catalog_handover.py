"""No silent catalog (issue 80): below the command line and the Flower apps, a run looks its pieces up only in the
catalog handed to it (its Runtime's). A missed hand-over is refused at the first lookup, never answered from the
context's own catalog, which may hold other pieces."""

from __future__ import annotations

import pytest

from fedl2p_cli import methods, plugins
from fedl2p_cli.artifacts import Store
from fedl2p_cli.catalog import DATASET
from fedl2p_cli.cli import options
from fedl2p_cli.errors import FedL2PError
from fedl2p_cli.methods import check
from fedl2p_cli.runtime import Runtime
from fedl2p_cli.stages import partition
from fedl2p_cli.stages.interface import Inputs, StageContext, run_stage

from .test_cli import cli


def test_a_runtime_without_a_catalog_is_refused_even_where_the_context_has_one():
    # the context's catalog (what a fallback would answer from) is set, and not answered from
    with plugins.using(plugins.build()), pytest.raises(plugins.NoCatalog, match="this run's Runtime carries no catalog"):
        plugins.of(Runtime())
    handed = plugins.build()
    assert plugins.of(Runtime(catalog=handed)).get(DATASET, "digits") is handed.get(DATASET, "digits")


def test_a_stage_handed_no_catalog_stops_before_it_builds(tmp_path):
    store = Store(tmp_path / "store")
    cfg = partition.PartitionConfig(dataset="digits", clients=4, samples_per_client=20)
    with plugins.using(plugins.build()), pytest.raises(plugins.NoCatalog):
        run_stage(partition, cfg, Inputs(), StageContext(store, Runtime()))
    assert store.ids("partition") == []


def test_a_hand_over_broken_at_the_command_line_is_one_line_and_builds_nothing(capsys, monkeypatch, tmp_path):
    """The command line puts its catalog in every build's Runtime (cli/options.store_options); dropped there, the
    command stops in one line instead of running on whatever catalog the context has."""
    args = ("partition", "--dataset", "digits", "--clients", "4", "--samples-per-client", "20")
    handing = options.store_options
    monkeypatch.setattr(options, "store_options", lambda ctx: handing(ctx) | {"catalog": None})
    code, _, err = cli(capsys, monkeypatch, tmp_path / "store", *args)
    assert (code, err.count("\n")) == (2, 1) and "carries no catalog" in err and "Traceback" not in err
    assert Store(tmp_path / "store").ids("partition") == []
    monkeypatch.setattr(options, "store_options", handing)
    code, _, err = cli(capsys, monkeypatch, tmp_path / "store", *args)
    assert code == 0 and len(Store(tmp_path / "store").ids("partition")) == 1, err


def test_a_method_check_names_the_plugin_of_the_catalog_it_is_handed():
    """methods/check.py reads the catalog the method was looked up in, not the context's (which may have it from
    another plugin, or not at all)."""
    frozen = methods.HandMade("ft-frozen", "FT frozen", lr_factor=0.0, baseline=False)

    def registered_by(module: str):
        def register(registry):
            registry.add_method(frozen)
        register.__module__ = module
        return plugins.build(register)

    refusal = "^method 'ft-frozen' from plugin 'the_handed_plugin': lr_factor 0.0"
    with plugins.using(registered_by("the_contexts_plugin")), pytest.raises(FedL2PError, match=refusal):
        check.rate(frozen, registered_by("the_handed_plugin"))
