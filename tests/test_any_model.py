"""Any nn.Module as the model (models/registry.py, models/bn_swap.py): torchvision's own models, built with
`package.module:factory`, get mixing BN in place of every BatchNorm with the same eval outputs; a user's BN subclass
that computes something else is refused; --init loads a state dict saved from the user's own module under its own key
names; the built-in artifacts keep their ids."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

from fedl2p_cli import plugins
from fedl2p_cli.configs import PretrainConfig
from fedl2p_cli.core.bn import MixBN, bn_layers
from fedl2p_cli.errors import FedL2PError
from fedl2p_cli.models import bn_swap, registry
from fedl2p_cli.stages.pretrain import import_init

# the tiny store's ids (tests/conftest.py), from before models, datasets and methods became plugins: a change to how
# built-ins register must not change what they build
# meta and personalize follow the stable IFT settings (--psi-power, --scale-by-psi, --eta-bound, --eta-grad): their ids
# change with those defaults. Last: --psi-power 5 -> 3 (issue 52), when lambda_max came to be estimated on the Neumann
# series' own Krylov space instead of by 5 extra power iterations (a different psi, so a different artifact)
# personalize: a learned variant named in --methods no longer enters the id (its meta-train artifact is a parent), so
# stage by stage and a pipeline give one id (issue 51)
PINNED = {"partition": "6e46b63b4df2", "pretrain": "ad17bd04e292", "stats": "37c5abb855fd", "meta": "24171ac9b934",
          "personalize": "62530938a5e2"}


def test_the_builtin_artifacts_keep_their_ids(tiny_store):
    assert {k: tiny_store[k].id for k in PINNED} == PINNED


@pytest.fixture
def allow():
    """`allow(ref)`: the user named ref's module, as --model does at the command line (its runtime's allow_import,
    which the stage interface hands down in the catalog): allowed for the rest of the test; returns that catalog."""
    with contextlib.ExitStack() as stack:
        yield lambda ref: stack.enter_context(plugins.using(plugins.current().allowing([ref.partition(":")[0]])))


@pytest.mark.parametrize("factory", ["torchvision.models:resnet18", "torchvision.models:mobilenet_v3_small"])
def test_a_torchvision_model_gets_mixing_bn_with_the_same_outputs(factory, allow):
    catalog = allow(factory)  # named by the user, as --model does (an unnamed module is refused: tests/test_imports.py)
    plain = registry._call(registry.spec(factory, catalog).factory, 3, 10)
    n_bn = len(bn_swap.plain_bn(plain))
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    bn_swap._randomise_bn(plain, torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = plain.eval()(x)
    names = [n for n, _ in bn_swap.plain_bn(plain)]
    state = plain.state_dict()
    swapped = bn_swap.replace_bn(plain)
    assert not bn_swap.plain_bn(swapped) and [n for n, _ in bn_layers(swapped)] == names and len(names) == n_bn > 5
    with torch.no_grad():
        got = swapped.eval()(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # the same key names, so the user's own state dict loads (MixBN keeps no num_batches_tracked)
    assert set(swapped.state_dict()) == {k for k in state if not k.endswith("num_batches_tracked")}
    if factory.endswith("mobilenet_v3_small"):  # its hard-swish has no second derivative: refused when built
        with pytest.raises(FedL2PError, match="is not twice differentiable .*hardsigmoid_backward"):
            registry.build(factory, 3, 10, seed=0, input_shape=(3, 32, 32), catalog=plugins.current())
        return
    built = registry.build(factory, 3, 10, seed=0, input_shape=(3, 32, 32), catalog=plugins.current())  # the checked path the stages take
    assert all(isinstance(m, MixBN) for _, m in bn_layers(built)) and len(bn_layers(built)) == n_bn


class ScaledBN(nn.BatchNorm2d):
    """A user's BatchNorm subclass that computes something else: the swap would change the model."""

    def forward(self, x):
        return 2 * super().forward(x)


class OwnBN(nn.BatchNorm2d):
    """A user's BatchNorm subclass that only renames: swapped like any BatchNorm2d."""


def net(bn: type[nn.Module]):
    def factory(in_channels: int, num_classes: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(in_channels, 4, 3, bias=False), bn(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(4, num_classes))
    return factory


def own_models(registry) -> None:
    registry.add_model("own-bn", net(OwnBN))
    registry.add_model("scaled-bn", net(ScaledBN))


def test_a_bn_subclass_is_swapped_when_it_is_a_batchnorm_and_refused_when_it_is_not():
    with plugins.using(plugins.build(own_models)):
        bn_subclasses()


def bn_subclasses():
    assert len(bn_layers(registry.build("own-bn", 1, 3, input_shape=(1, 8, 8), catalog=plugins.current()))) == 1
    with pytest.raises(FedL2PError, match="model 'scaled-bn': its outputs change"):
        registry.build("scaled-bn", 1, 3, input_shape=(1, 8, 8), catalog=plugins.current())
    with pytest.raises(FedL2PError, match="outputs shape"):  # a model with 5 outputs for a partition of 3 classes
        registry._check_classes(net(OwnBN)(1, 5), torch.zeros(2, 1, 8, 8), 3, "own-bn")


def net_with(act: nn.Module):
    def factory(in_channels: int, num_classes: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(in_channels, 4, 3, bias=False), nn.BatchNorm2d(4), act, nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(4, num_classes))
    return factory


class TwiceDifferentiableHardSigmoid(nn.Module):
    def forward(self, x):
        return nn.functional.relu6(x + 3) / 6


def test_a_model_that_is_not_twice_differentiable_is_refused_when_built_and_the_check_changes_nothing():
    """FedL2P's meta-gradient differentiates through fine-tuning: a layer autograd cannot differentiate twice
    (nn.Hardsigmoid) is one line when the stage builds the model, not an error in the middle of meta-train. The check
    leaves the built model, its BN statistics and torch's global random state as they were."""
    def models(registry):
        registry.add_model("hs", net_with(nn.Hardsigmoid()))
        registry.add_model("hs2", net_with(TwiceDifferentiableHardSigmoid()))

    with plugins.using(plugins.build(models)):
        with pytest.raises(FedL2PError, match="model 'hs' is not twice differentiable .*hardsigmoid_backward"):
            registry.build("hs", 1, 3, input_shape=(1, 8, 8), catalog=plugins.current())
        checked = registry.build("hs2", 1, 3, seed=4, input_shape=(1, 8, 8), catalog=plugins.current())
        after_check = torch.get_rng_state()
        plain = registry.build("hs2", 1, 3, seed=4, catalog=plugins.current())
        assert torch.equal(torch.get_rng_state(), after_check)  # the check drew nothing from torch's global generator
    assert checked.state_dict().keys() == plain.state_dict().keys()
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in checked.state_dict().items())


def test_init_loads_the_users_own_state_dict(tmp_path, allow):
    """A torchvision ResNet-18 trained by the user (here: random weights and BN statistics), saved with torch.save
    under torchvision's key names, loads into the model fedl2p builds from the same factory."""
    factory = "torchvision.models:resnet18"
    user = registry._call(registry.spec(factory, allow(factory)).factory, 3, 10)
    bn_swap._randomise_bn(user, torch.Generator().manual_seed(3))
    torch.save(user.state_dict(), tmp_path / "mine.pt")
    model = registry.build(factory, 3, 10, seed=5, input_shape=(3, 32, 32), catalog=plugins.current())
    state = import_init(PretrainConfig(model=factory, init=str(tmp_path / "mine.pt")), model)
    want = {k: v for k, v in user.state_dict().items() if not k.endswith("num_batches_tracked")}
    assert state.keys() == want.keys()
    assert all(torch.equal(state[k], want[k]) for k in want)
    assert registry.head_prefix(model) == "fc."


def test_a_model_reference_that_does_not_load_is_one_error(allow):
    with pytest.raises(FedL2PError, match="--model no_such_pkg.mod:f: refusing to import .* --allow-import no_such_pkg.mod"):
        registry.build("no_such_pkg.mod:f", 3, 10, catalog=plugins.current())  # nobody named or allowed it: not even looked for
    allow("no_such_pkg.mod:f")
    with pytest.raises(FedL2PError, match="--model no_such_pkg.mod:f: cannot load it"):
        registry.build("no_such_pkg.mod:f", 3, 10, catalog=plugins.current())
    with pytest.raises(FedL2PError, match="unknown model 'vgg'"):
        registry.build("vgg", 3, 10, catalog=plugins.current())
