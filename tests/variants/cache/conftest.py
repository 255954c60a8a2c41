"""Cache helpers: build a layout, and the plans the engine hands a cache (prefill, decode)."""

import pytest
import torch

from variants.cache.contiguous import ContiguousKVCache
from variants.cache.paged import PagedKVCache
from variants.cache.plans import CachePlan
from variants.cache.slab import SlabKVCache

LAYOUTS = ("contiguous", "slab", "paged16", "paged64")


def _make(spec, layout: str, capacity_tokens: int):
    cpu = torch.device("cpu")
    if layout.startswith("paged"):
        return PagedKVCache(spec, cpu, torch.float32, capacity_tokens, int(layout[5:]))
    cls = {"contiguous": ContiguousKVCache, "slab": SlabKVCache}[layout]
    return cls(spec, cpu, torch.float32, capacity_tokens)


def _allocate_plan(cache, rids, lengths) -> CachePlan:
    """What Engine.prefill does: allocate, then one write index over all prompts."""
    for rid, n in zip(rids, lengths):
        cache.allocate(rid, n)
    slots = [i for r, n in zip(rids, lengths) for i in cache.token_slots(r, 0, n)]
    return CachePlan(
        list(rids),
        write_index=torch.tensor(slots, dtype=torch.long),
        segments=[(r, 0, n) for r, n in zip(rids, lengths)],
    )


def _append_plan(cache, rids, positions) -> CachePlan:
    """What a decode step does: room for one token each, write at `positions`, read to p+1."""
    cache.extend_step(list(rids), list(positions))
    kv_lens = [p + 1 for p in positions]
    return CachePlan(
        list(rids),
        write_index=torch.tensor(cache.step_slots(list(rids), list(positions))),
        kv_lens=torch.tensor(kv_lens),
        max_len=max(kv_lens),
        uniform=min(kv_lens) == max(kv_lens),
        rows=cache.read_rows(list(rids)),
        segments=[(r, p, 1) for r, p in zip(rids, positions)],
    )


def _read_plan(cache, rids, kv_lens) -> CachePlan:
    return CachePlan(
        list(rids),
        kv_lens=torch.tensor(kv_lens),
        max_len=max(kv_lens),
        uniform=min(kv_lens) == max(kv_lens),
        rows=cache.read_rows(list(rids)),
    )


@pytest.fixture
def make_cache(tiny_spec):
    return lambda layout, capacity_tokens=4096: _make(tiny_spec, layout, capacity_tokens)


@pytest.fixture
def allocate_plan():
    return _allocate_plan


@pytest.fixture
def append_plan():
    return _append_plan


@pytest.fixture
def read_plan():
    return _read_plan
