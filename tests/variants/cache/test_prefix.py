"""PrefixCachedPagedKVCache bookkeeping: hash chains over full blocks, shared blocks with
refcounts, released blocks kept matchable in an LRU and evicted only when the free list is empty,
growth and CacheFullError as on the paged cache."""

import pytest
import torch

from variants.cache.pool import CacheFullError, pool_bytes
from variants.cache.prefix import PrefixCachedPagedKVCache

BS = 16


def prefix_cache(spec, tokens: int = 4096, limit_bytes=None) -> PrefixCachedPagedKVCache:
    cpu = torch.device("cpu")
    return PrefixCachedPagedKVCache(spec, cpu, torch.float32, tokens, BS, limit_bytes)


def prompt(seed: int, n: int) -> list:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def admit(cache, rid: int, ids: list) -> int:
    """What the engine's prefill does around its forward pass: match, allocate, publish."""
    hashes = cache.block_hashes(ids)
    cache.reserve_prompts([rid], [len(ids)])
    start = cache.allocate_prompt(rid, len(ids), hashes)
    cache.publish(rid, hashes)
    return start


def state(cache) -> tuple:
    return (
        {r: list(t) for r, t in cache.table.items()},
        dict(cache.refs),
        list(cache.free_blocks),
        list(cache.evictable),
        dict(cache.block_of),
        cache.blocks,
    )


def test_hashes_chain_over_full_blocks(tiny_spec):
    cache = prefix_cache(tiny_spec)
    a = prompt(0, 3 * BS + 5)
    hashes = cache.block_hashes(a)
    assert len(hashes) == 3 and len(set(hashes)) == 3  # the partial block has none
    assert cache.block_hashes(a[: 2 * BS]) == hashes[:2]
    assert cache.block_hashes(a[: BS - 1]) == []
    b = list(a)
    b[BS + 3] = (b[BS + 3] + 1) % 256  # one token of block 1 differs
    other = cache.block_hashes(b)
    assert other[0] == hashes[0] and other[1] != hashes[1]
    assert other[2] != hashes[2]  # the same tokens after a different prefix: another hash


@pytest.mark.parametrize("shared_blocks", [1, 2, 3])
def test_a_shared_prefix_maps_the_same_blocks_and_counts_references(tiny_spec, shared_blocks):
    cache = prefix_cache(tiny_spec)
    system = prompt(1, shared_blocks * BS + 7)
    shared = shared_blocks * BS
    assert admit(cache, 1, system + prompt(2, 9)) == 0
    free = len(cache.free_blocks)
    assert admit(cache, 2, system + prompt(3, 30)) == shared
    assert admit(cache, 3, system[:shared] + prompt(4, 1)) == shared
    head = cache.table[1][:shared_blocks]
    assert cache.table[2][:shared_blocks] == head == cache.table[3][:shared_blocks]
    assert all(cache.refs[b] == 3 for b in head)
    tails = [b for r in (1, 2, 3) for b in cache.table[r][shared_blocks:]]
    assert len(tails) == len(set(tails)) and not set(tails) & set(head)  # never written shared
    assert all(cache.refs[b] == 1 for b in tails)
    # only the new requests' own blocks came off the free list
    assert free - len(cache.free_blocks) == len(cache.table[2]) + len(cache.table[3]) - 2 * len(
        head
    )
    cache.release(1)
    assert all(cache.refs[b] == 2 for b in head)
    cache.release(2)
    cache.release(3)
    assert cache.refs == {} and cache.table == {}
    # the published blocks stay matchable, the others are free again
    assert set(cache.evictable) == set(cache.block_of.values()) and set(head) <= set(
        cache.evictable
    )
    assert not set(cache.evictable) & set(cache.free_blocks)
    assert admit(cache, 4, system + prompt(5, 2)) == shared
    assert cache.table[4][:shared_blocks] == head


@pytest.mark.parametrize("n, cached", [(BS, 0), (2 * BS, BS), (2 * BS + 1, 2 * BS)])
def test_a_fully_cached_prompt_still_computes_its_last_token(tiny_spec, n, cached):
    cache = prefix_cache(tiny_spec)
    ids = prompt(6, n)
    admit(cache, 1, ids)
    assert admit(cache, 2, ids) == cached  # its last token's block is its own
    assert n - cached >= 1
    last = (n - 1) // BS
    assert cache.table[2][last] != cache.table[1][last]
    assert cache.table[2][:last] == cache.table[1][:last]


def test_released_blocks_are_evicted_least_recent_first_only_when_none_is_free(tiny_spec):
    cache = prefix_cache(tiny_spec, tokens=8 * BS)  # 8 blocks (and scratch)
    a, b = prompt(7, 2 * BS + 1), prompt(8, 2 * BS + 1)
    admit(cache, 1, a)
    admit(cache, 2, b)
    cache.release(1)  # a's two full blocks: the least recently released
    cache.release(2)
    assert len(cache.free_blocks) == 4 and len(cache.evictable) == 4
    a_blocks = [cache.block_of[h] for h in cache.block_hashes(a)]
    admit(cache, 3, prompt(9, 4 * BS))  # takes the free blocks: nothing evicted
    assert len(cache.evictable) == 4 and cache.free_blocks == []
    admit(cache, 4, prompt(10, BS))  # the pool is full: a's tail block goes first
    assert cache.table[4] == [a_blocks[1]] and cache.blocks == 9
    a_hashes, b_hashes = cache.block_hashes(a), cache.block_hashes(b)
    assert a_hashes[0] in cache.block_of and a_hashes[1] not in cache.block_of
    assert admit(cache, 5, a) == BS  # a's first block still matches, its second is gone
    assert cache.table[5][0] == a_blocks[0]
    # a's two new blocks took b's, tail first: the re-match misses
    assert not set(b_hashes) & set(cache.block_of) and cache.blocks == 9
    assert admit(cache, 6, b) == 0


def test_growth_keeps_the_index_and_what_the_blocks_hold(tiny_spec):
    cache = prefix_cache(tiny_spec, tokens=2 * BS)
    ids = prompt(12, 2 * BS + 3)
    admit(cache, 1, ids)
    blocks = list(cache.table[1])
    cache.k[0, blocks[0] * BS : (blocks[0] + 1) * BS] = 7.0
    generation = cache.generation
    admit(cache, 2, prompt(13, 10 * BS))  # more than the pool holds: it doubles and copies
    assert cache.generation > generation and cache.blocks > 3
    assert admit(cache, 3, ids) == 2 * BS and cache.table[3][:2] == blocks[:2]
    assert (cache.k[0, blocks[0] * BS : (blocks[0] + 1) * BS] == 7.0).all()


def test_full_pool_raises_before_anything_changes(tiny_spec):
    """Within its limit the pool cannot grow: evictable blocks count as room, and a call that
    needs more raises CacheFullError with every table, count and index as they were."""
    limit = pool_bytes(tiny_spec, torch.float32, 5 * BS)
    cache = prefix_cache(tiny_spec, tokens=4 * BS, limit_bytes=limit)  # 4 blocks, no more
    ids = prompt(14, 2 * BS + 1)
    admit(cache, 1, ids)
    cache.release(1)  # 2 blocks evictable, 2 free
    admit(cache, 2, prompt(15, 3 * BS))  # 2 free + 1 evicted
    assert len(cache.evictable) == 1
    before = state(cache)
    with pytest.raises(CacheFullError):
        cache.reserve_prompts([3], [2 * BS + 1])
    with pytest.raises(CacheFullError):
        cache.reserve_prompts([2], [5 * BS])  # a re-prefill gets back only what it holds
    assert state(cache) == before
    assert admit(cache, 3, ids[:BS]) == 0  # one block fits: the last evictable one


def test_reprefill_counts_only_the_blocks_it_holds_alone(tiny_spec):
    limit = pool_bytes(tiny_spec, torch.float32, 7 * BS)
    cache = prefix_cache(tiny_spec, tokens=6 * BS, limit_bytes=limit)  # 6 blocks, no more
    system = prompt(16, 2 * BS)
    admit(cache, 1, system + [1])
    admit(cache, 2, system + [2])  # shares 2 blocks with 1, and 1 block of its own
    assert len(cache.free_blocks) == 2
    before = state(cache)
    with pytest.raises(CacheFullError):  # 4 blocks, only its own 1 comes back: 3 > 2 free
        cache.reserve_prompts([2], [4 * BS])
    assert state(cache) == before
    cache.reserve_prompts([2], [3 * BS])  # 3 blocks: its own and the 2 free


def test_truncate_gives_back_a_refused_decode_block(tiny_spec):
    cache = prefix_cache(tiny_spec)
    admit(cache, 1, prompt(17, 2 * BS))
    before = state(cache)
    cache.extend_step([1], [2 * BS])  # a decode that starts block 2
    assert len(cache.table[1]) == 3 and cache.refs[cache.table[1][2]] == 1
    cache.truncate(1, 2 * BS)  # ... refused
    assert state(cache) == before
