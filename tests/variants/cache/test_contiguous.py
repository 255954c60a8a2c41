"""ContiguousKVCache bookkeeping: own tensors per request, power-of-two capacity, doubling."""

import pytest
import torch

from variants.cache.contiguous import ContiguousKVCache


def contiguous(spec) -> ContiguousKVCache:
    return ContiguousKVCache(spec, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("length, capacity", [(1, 1), (2, 2), (5, 8), (8, 8), (9, 16)])
def test_capacity_is_the_next_power_of_two(tiny_spec, length, capacity):
    cache = contiguous(tiny_spec)
    cache.allocate(1, length)
    k, v = cache.store[1]
    assert k.shape == v.shape == (2, capacity, 2, 24)
    assert cache.memory_bytes() == 2 * k.numel() * 4


def test_extend_doubles_and_keeps_contents(tiny_spec):
    cache = contiguous(tiny_spec)
    cache.allocate(1, 5)
    cache.store[1][0][1, :5] = 2.0
    cache.store[1][1][0, 4] = -1.0
    cache.extend(1, 8)
    assert cache.store[1][0].shape[1] == 8
    cache.extend(1, 9)
    k, v = cache.store[1]
    assert k.shape[1] == 16
    assert torch.equal(k[1, :5], torch.full((5, 2, 24), 2.0))
    assert torch.equal(v[0, 4], torch.full((2, 24), -1.0))
    assert torch.equal(k[1, 5:], torch.zeros(11, 2, 24))


def test_release_frees_the_tensors(tiny_spec):
    cache = contiguous(tiny_spec)
    cache.allocate(1, 5)
    cache.allocate(2, 5)
    cache.release(1)
    assert list(cache.store) == [2]
    assert cache.memory_bytes() == 2 * 2 * 8 * 2 * 24 * 4
    assert list(cache.token_slots(2, 3, 6)) == [3, 4, 5]
    assert cache.read_rows([2]) == [2]


def test_extend_makes_room_for_the_total_length(tiny_spec):
    cache = contiguous(tiny_spec)
    cache.allocate(1, 4)
    cache.extend(1, 100)
    assert cache.store[1][0].shape[1] >= 100


def test_step_slots_are_the_positions(tiny_spec):
    cache = contiguous(tiny_spec)
    cache.allocate(1, 3)
    cache.allocate(2, 9)
    assert cache.step_slots([2, 1], [8, 2]) == [8, 2]
