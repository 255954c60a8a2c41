"""PagedKVCache bookkeeping: ceil(len / block_size) blocks per request, blocks return to the pool,
block 0 is never handed out, and pool growth keeps contents."""

import pytest
import torch

from variants.cache.paged import PagedKVCache


def paged(spec, tokens: int, block_size: int) -> PagedKVCache:
    return PagedKVCache(spec, torch.device("cpu"), torch.float32, tokens, block_size=block_size)


@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("length", [1, 15, 16, 17, 64, 65, 512])
def test_block_count_is_ceil_of_length(tiny_spec, block_size, length):
    cache = paged(tiny_spec, 4096, block_size)
    free = len(cache.free_blocks)
    cache.allocate(3, length)
    assert len(cache.table[3]) == -(-length // block_size)
    assert len(cache.free_blocks) == free - len(cache.table[3])
    cache.release(3)
    assert len(cache.free_blocks) == free and 3 not in cache.table


def test_extend_adds_a_block_only_at_the_boundary(tiny_spec):
    cache = paged(tiny_spec, 4096, 16)
    cache.allocate(1, 15)
    cache.extend(1, 16)
    assert len(cache.table[1]) == 1
    cache.extend(1, 17)
    assert len(cache.table[1]) == 2
    cache.extend(1, 100)  # room for 100 tokens in total, in one call
    assert len(cache.table[1]) == 7


def test_truncate_gives_back_the_blocks_past_a_length(tiny_spec):
    cache = paged(tiny_spec, 4096, 16)
    cache.allocate(1, 16)
    before = (list(cache.table[1]), list(cache.free_blocks))
    cache.extend(1, 17)  # a decode that crosses into a second block
    cache.truncate(1, 16)  # ... refused
    assert (cache.table[1], cache.free_blocks) == before
    cache.extend(1, 40)
    cache.truncate(1, 17)
    assert len(cache.table[1]) == 2


def test_token_slots_follow_the_block_table(tiny_spec):
    cache = paged(tiny_spec, 4096, 16)
    cache.allocate(1, 20)
    cache.allocate(2, 5)
    cache.release(1)
    cache.allocate(3, 40)  # reuses the two freed blocks, then a new one
    b = cache.table[3]
    assert len(b) == 3 and len(set(b)) == 3
    slots = cache.token_slots(3, 14, 34)
    expected = [b[p // 16] * 16 + p % 16 for p in range(14, 34)]
    assert slots.typecode == "q" and slots.tolist() == expected  # an int64 array
    assert set(b).isdisjoint(cache.table[2])


def test_token_slots_runs_match_the_per_position_formula(tiny_spec):
    """Slots come in one run per block: every start, one token or many, across block edges."""
    cache = paged(tiny_spec, 128, 16)
    cache.allocate(7, 3)
    cache.allocate(8, 45)
    b = cache.table[8]
    for start in range(45):
        for stop in {start + 1, min(45, start + 17), 45}:
            want = [b[p // 16] * 16 + p % 16 for p in range(start, stop)]
            assert cache.token_slots(8, start, stop).tolist() == want, (start, stop)
    assert len(cache.token_slots(8, 5, 5)) == 0


def test_block_zero_is_scratch_and_never_handed_out(tiny_spec):
    cache = paged(tiny_spec, 64, 16)
    for rid in range(20):
        cache.allocate(rid, 17)
    used = [blk for table in cache.table.values() for blk in table]
    assert 0 not in used and len(used) == len(set(used)) == 40
    assert cache.scratch_token() == 0
    rows = cache.read_rows([0, 1])
    assert rows.tolist() == [cache.table[0], cache.table[1]]


def test_growth_keeps_contents_and_bumps_the_generation(tiny_spec):
    cache = paged(tiny_spec, 32, 16)  # 1 scratch + 2 usable blocks
    assert cache.blocks == 3 and len(cache.free_blocks) == 2
    cache.allocate(1, 32)
    slots = torch.tensor(cache.token_slots(1, 0, 32))
    cache.k[0, slots] = torch.arange(32.0)[:, None, None].expand(32, 2, 24)
    cache.allocate(2, 5)  # the pool is empty: it doubles
    assert cache.blocks == 6 and cache.generation == 1
    assert torch.equal(cache.k[0, slots][:, 0, 0], torch.arange(32.0))
    assert cache.table[2] == [3]
    assert cache.memory_bytes() == 2 * 2 * 6 * 16 * 2 * 24 * 4


def test_read_rows_pads_tables_with_block_zero(tiny_spec):
    cache = paged(tiny_spec, 4096, 16)
    cache.allocate(1, 40)
    cache.allocate(2, 3)
    rows = cache.read_rows([2, 1])
    assert rows.shape == (2, 3)
    assert rows[0].tolist() == cache.table[2] + [0, 0]
    assert cache.table_width(40) == 3 and list(cache.table_row(2, 3)) == cache.table[2] + [0, 0]


def test_full_width_rows_follow_the_table_through_every_change(tiny_spec):
    """The rows a CUDA-graph call stages: the blocks, then block 0 to max_positions."""
    cache = paged(tiny_spec, 64, 16)  # 4 blocks + scratch: the pool grows on the way
    width = cache.table_width(tiny_spec.max_positions)

    def row(rid):
        return list(cache.table_row(rid, width))

    cache.allocate(1, 20)
    cache.allocate(2, 1)
    assert row(1) == cache.table[1] + [0] * (width - 2)
    cache.extend(1, 70)  # past the pool: it grows
    assert row(1) == cache.table[1] + [0] * (width - 5)
    assert row(2) == cache.table[2] + [0] * (width - 1)
    cache.truncate(1, 33)
    assert row(1) == cache.table[1] + [0] * (width - 3)
    cache.release(2)
    cache.allocate(2, 17)  # a reused id starts from an empty row
    assert row(2) == cache.table[2] + [0] * (width - 2)
    assert row(None) == [0] * width and list(cache.table_row(1, 2)) == cache.table[1][:2]


def test_step_slots_are_each_rows_token_slot(tiny_spec):
    cache = paged(tiny_spec, 4096, 16)
    cache.allocate(1, 40)
    cache.allocate(2, 17)
    got = cache.step_slots([2, 1], [16, 39])
    assert got == [cache.token_slots(2, 16, 17)[0], cache.token_slots(1, 39, 40)[0]]
