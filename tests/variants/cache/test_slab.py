"""SlabKVCache bookkeeping: one max_positions slot per request, lowest free slot first, growth
keeps contents, consecutive slots read as a slice (a view)."""

import torch

from variants.cache.slab import SlabKVCache


def slab(spec, slots: int) -> SlabKVCache:
    return SlabKVCache(spec, torch.device("cpu"), torch.float32, slots * spec.max_positions)


def test_allocate_release_and_lowest_slot_first(tiny_spec):
    cache = slab(tiny_spec, 4)
    assert cache.slots == 4 and cache.free_slots == [3, 2, 1, 0]
    for rid in (10, 11, 12):
        cache.allocate(rid, 5)
    assert cache.slot_of == {10: 0, 11: 1, 12: 2}
    cache.release(10)
    cache.release(12)
    assert sorted(cache.free_slots) == [0, 2, 3] and 10 not in cache.slot_of
    cache.allocate(13, 1)
    assert cache.slot_of[13] == 0
    cache.extend_step([13], [511])  # a slot holds max_positions already
    assert cache.slots == 4 and cache.generation == 0
    for rid in (11, 13):
        cache.release(rid)
    assert sorted(cache.free_slots) == [0, 1, 2, 3] and cache.slot_of == {}


def test_token_slots_are_flat_positions_in_the_slot(tiny_spec):
    cache = slab(tiny_spec, 2)
    cache.allocate(1, 3)
    cache.allocate(2, 3)
    assert list(cache.token_slots(2, 4, 7)) == [512 + 4, 512 + 5, 512 + 6]
    assert list(cache.token_slots(1, 0, 2)) == [0, 1]
    assert cache.step_slots([2, 1], [6, 0]) == [512 + 6, 0]  # a decode step's writes


def test_growth_doubles_and_keeps_contents(tiny_spec):
    cache = slab(tiny_spec, 1)
    cache.allocate(1, 4)
    cache.k[1, 0:4] = 3.0
    cache.v[0, 2] = -5.0
    generation = cache.generation
    cache.allocate(2, 4)
    assert cache.slots == 2 and cache.slot_of == {1: 0, 2: 1}
    assert cache.generation == generation + 1
    assert torch.equal(cache.k[1, 0:4], torch.full((4, 2, 24), 3.0))
    assert torch.equal(cache.v[0, 2], torch.full((2, 24), -5.0))
    cache.allocate(3, 4)
    assert cache.slots == 4 and cache.free_slots == [3]
    assert torch.equal(cache.k[1, 0:4], torch.full((4, 2, 24), 3.0))
    # The scratch slot (for CUDA-graph padding rows) lies past every request slot.
    assert cache.scratch_token() == 4 * 512
    assert cache.k.shape[1] == 5 * 512
    assert cache.memory_bytes() == 2 * cache.k.numel() * 4


def test_read_rows_slice_for_consecutive_slots_tensor_otherwise(tiny_spec):
    cache = slab(tiny_spec, 4)
    for rid in (5, 6, 7, 8):
        cache.allocate(rid, 2)
    assert cache.read_rows([6, 7, 8]) == slice(1, 4)
    assert cache.read_rows([7]) == slice(2, 3)
    rows = cache.read_rows([5, 7])
    assert isinstance(rows, torch.Tensor) and rows.tolist() == [0, 2]
    rows = cache.read_rows([8, 7])  # consecutive but descending: not a slice
    assert isinstance(rows, torch.Tensor) and rows.tolist() == [3, 2]


def test_slice_and_gather_reads_agree(tiny_spec, read_plan):
    cache = slab(tiny_spec, 4)
    for rid in (5, 6, 7):
        cache.allocate(rid, 2)
    cache.k.normal_(generator=torch.Generator().manual_seed(0))
    view_plan = read_plan(cache, [5, 6, 7], [9, 4, 9])
    gather_plan = read_plan(cache, [7, 5], [9, 9])
    assert isinstance(view_plan.rows, slice) and isinstance(gather_plan.rows, torch.Tensor)
    k_view, _ = cache.read(1, view_plan)
    k_gather, _ = cache.read(1, gather_plan)
    assert k_view.shape == (3, 2, 9, 24)
    assert torch.equal(k_view[2], k_gather[0]) and torch.equal(k_view[0], k_gather[1])
