import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedl2p_cli import plugins
from fedl2p_cli.algorithms.local import LocalConfig, perfedavg_hf_step, sgd_client
from fedl2p_cli.artifacts import Store
from fedl2p_cli.core.aggregate import weighted_average
from fedl2p_cli.core.functional import get_state
from fedl2p_cli.engine.loop import Checkpoint, generator, sample_clients, step_lr
from fedl2p_cli.engine.progress import NoProgress
from fedl2p_cli.io import weights
from fedl2p_cli.models import registry
from fedl2p_cli.stages import partition, pretrain

from .conftest import TINY_PARTITION, TINY_PRETRAIN
from .helpers import KillAfter, Killed, execute, handed


def test_weighted_aggregation_exact():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([4.0, 8.0]), "n": torch.tensor(5)}
    out = weighted_average([a, b], [1, 3])
    assert torch.allclose(out["w"], torch.tensor([3.25, 6.5]))
    assert out["n"] == 3


def test_fedavg_one_client_full_participation_equals_sgd(tmp_path):
    store = Store(tmp_path)
    part_art, _ = execute(partition, partition.PartitionConfig(**(TINY_PARTITION | {"clients": 3, "unseen_fraction": 0,
                                                                                "corruptions": ["clean", "invert", "contrast"]})),
                          store, plot=False)
    _, part = partition.load(store, part_art.id)
    part.unseen[:] = True
    part.unseen[0] = False  # one seen client
    cfg = pretrain.PretrainConfig(rounds=2, fraction=1.0, batch_size=16, lr=0.05, eval_every=10)
    state, _ = pretrain.train(cfg, part, None, NoProgress(), runtime=handed())
    model = registry.build("small-cnn", part.in_channels, part.num_classes, 0, catalog=plugins.current())
    ref = get_state(model)
    x, y = part.client(0).train
    for rnd in range(2):
        ref, _ = sgd_client(model, ref, x, y, step_lr(0.05, rnd, 2), LocalConfig(batch_size=16), generator(0, rnd, 0))
    for k in ref:
        assert torch.allclose(state[k].float(), ref[k].float(), atol=1e-6), k


def test_fedbabu_head_is_bit_identical_to_init(tiny_store, tmp_path):
    store = tiny_store["store"]
    art, _ = execute(pretrain, pretrain.PretrainConfig(**(TINY_PRETRAIN | {"algo": "fedbabu", "rounds": 2})), store,
                     {"partition": tiny_store["partition"].id}, plot=False)
    state = weights.load(art.file("model.safetensors"))
    model = registry.build("small-cnn", 1, 10, 0, catalog=plugins.current())
    init = get_state(model)
    head = [k for k in init if k.startswith(registry.head_prefix(model))]
    assert head == ["13.weight", "13.bias"]  # the classifier really is found
    for k in head:
        assert torch.equal(state[k], init[k]), k
    body = [k for k in init if k.endswith("weight") and k not in head]
    assert all(not torch.equal(state[k], init[k]) for k in body)  # everything else trained


def test_perfedavg_hf_step_matches_hand_computation():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).double()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    batches = tuple((torch.randn(5, 3, dtype=torch.float64), torch.randint(0, 2, (5,))) for _ in range(3))
    alpha, beta = 0.1, 0.05
    got, _ = perfedavg_hf_step(model, params, batches, alpha, beta)

    def flat_loss(w, x, y):
        W, b = w[:6].view(2, 3), w[6:]
        return F.cross_entropy(x @ W.T + b, y)

    w = torch.cat([params["weight"].flatten(), params["bias"]])
    g1 = torch.autograd.functional.jacobian(lambda v: flat_loss(v, *batches[0]), w)
    g2 = torch.autograd.functional.jacobian(lambda v: flat_loss(v, *batches[1]), w - alpha * g1)
    H3 = torch.autograd.functional.hessian(lambda v: flat_loss(v, *batches[2]), w)
    expect = w - beta * (torch.eye(8, dtype=torch.float64) - alpha * H3) @ g2
    assert torch.allclose(torch.cat([got["weight"].flatten(), got["bias"]]), expect, atol=1e-12)


def test_resume_equals_uninterrupted(tiny_store, tmp_path):
    _, part = partition.load(tiny_store["store"], tiny_store["partition"].id)
    cfg = pretrain.PretrainConfig(**(TINY_PRETRAIN | {"rounds": 4}))
    full, hist = pretrain.train(cfg, part, None, NoProgress(), runtime=handed())
    ck = Checkpoint(tmp_path / "ck")

    with pytest.raises(Killed):
        pretrain.train(cfg, part, ck, KillAfter(2), runtime=handed())
    assert ck.load().next_round == 2
    resumed, hist2 = pretrain.train(cfg, part, ck, NoProgress(), runtime=handed())
    for k in full:
        assert torch.equal(full[k], resumed[k]), k
    assert [h["train_loss"] for h in hist] == [h["train_loss"] for h in hist2]


def test_sampling_and_schedule():
    assert sample_clients(list(range(100)), 0.1, 0, 3) == sample_clients(list(range(100)), 0.1, 0, 3)
    assert len(sample_clients(list(range(100)), 0.1, 0, 3)) == 10
    assert np.allclose([step_lr(0.1, r, 8) for r in (0, 3, 4, 5, 6, 7)], [0.1, 0.1, 0.01, 0.01, 0.001, 0.001])
