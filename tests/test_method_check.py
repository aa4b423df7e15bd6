"""A hand-made method that fine-tunes nothing (issue 51): `tensors(model)` naming a tensor the model lacks, or none,
printed a normal row ("FT wrong name | 87.50") and exited 0. Now one line listing the model's tensor names (after the
BN swap), exit 2, nothing written."""

from __future__ import annotations

import pytest

from fedl2p_cli import methods, plugins
from fedl2p_cli.cli.main import run_cli

# the tiny store's small-cnn, as a method's tensors(model) receives it (MixBN keeps BatchNorm's parameter names)
NAMES = "0.weight, 1.weight, 1.bias, 4.weight, 5.weight, 5.bias, 8.weight, 9.weight, 9.bias, 13.weight, 13.bias"

CASES = {
    "ft-wrong-name": (lambda model: ["head.weight"], "tensors(model) names 'head.weight', which the model does not "
                      f"have; its tensors (after the BN swap): {NAMES}"),
    "ft-nothing": (lambda model: [], "tensors(model) names no tensor, so it would fine-tune nothing; the model's "
                   f"tensors (after the BN swap): {NAMES}"),
    "ft-raises": (lambda model: model.no_such_attribute, "tensors(model) raised AttributeError"),
}


WHO = "method '{}' from plugin '" + __name__ + "'"  # registered by this module's own catalog (plugins.build)


def own(method: methods.Method):
    """A catalog of this test's own, with `method` registered."""
    return plugins.using(plugins.build(lambda registry: registry.add_method(method)))


@pytest.mark.parametrize("name", list(CASES))
def test_a_method_that_fine_tunes_nothing_is_refused(name, tiny_store, capsys, monkeypatch):
    tensors, line = CASES[name]
    with own(methods.HandMade(name, name.upper(), baseline=False, tensors=tensors)):
        refused(name, line, tiny_store, capsys, monkeypatch)


def refused(name, line, tiny_store, capsys, monkeypatch):
    store = tiny_store["store"]
    before = sorted(store.ids("personalize"))
    monkeypatch.setenv("FEDL2P_STORE", str(store.root))
    capsys.readouterr()
    code = run_cli(["personalize", "--methods", name, "--epochs", "1", "--batch-size", "16", "--seeds", "0"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {WHO.format(name)}: {line}") and err.count("\n") == 1
    assert sorted(store.ids("personalize")) == before


def test_a_method_with_no_learning_rate_is_refused(tiny_store, capsys, monkeypatch):
    monkeypatch.setenv("FEDL2P_STORE", str(tiny_store["store"].root))
    capsys.readouterr()
    with own(methods.HandMade("ft-frozen", "FT frozen", lr_factor=0.0, baseline=False)):
        code = run_cli(["personalize", "--methods", "ft-frozen", "--epochs", "1", "--batch-size", "16", "--seeds", "0"])
    assert (code, capsys.readouterr().err) == (2, f"error: {WHO.format('ft-frozen')}: lr_factor 0.0 fine-tunes nothing; "
                                                  "it must be > 0\n")
