"""Batch order: every index exactly once per epoch, and no batch of one sample (BatchNorm cannot train on it)."""

import pytest
import torch

from fedl2p_cli.core.functional import epochs_of_batches, shuffled_batches


@pytest.mark.parametrize("n", [1, 2, 31, 32, 33, 64, 65, 97, 120])
def test_each_index_once_and_no_lone_sample(n):
    batches = shuffled_batches(n, 32, torch.Generator().manual_seed(0))
    assert sorted(torch.cat(batches).tolist()) == list(range(n))
    assert all(len(b) >= 2 for b in batches) or n == 1
    assert all(len(b) <= 33 for b in batches)


def test_epochs_are_independent_shuffles_of_every_index():
    batches = epochs_of_batches(65, 32, torch.Generator().manual_seed(0), 3)
    assert [len(b) for b in batches] == [32, 33] * 3
    flat = torch.cat(batches)
    for e in range(3):
        assert sorted(flat[65 * e:65 * (e + 1)].tolist()) == list(range(65))
