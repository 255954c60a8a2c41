"""build_engine resolves the Variant's components from the registry table."""

import torch

from variants import Variant, build_engine
from variants.attention.manual import ManualAttention
from variants.attention.sdpa import SdpaAttention
from variants.build import resolve
from variants.cache.contiguous import ContiguousKVCache
from variants.cache.paged import PagedKVCache
from variants.cache.slab import SlabKVCache
from variants.execution.compiled import run_compiled


def test_resolve():
    assert resolve("variants.cache.paged:PagedKVCache") is PagedKVCache
    assert resolve("variants.execution.compiled:run_compiled") is run_compiled


def test_built_engine_has_the_chosen_parts(tiny_config, tiny_weights):
    cases = [
        (Variant(cache="paged", block_size=64, attention="manual"), PagedKVCache, ManualAttention),
        (Variant(cache="slab"), SlabKVCache, SdpaAttention),
        (Variant(cache="contiguous", attention="manual"), ContiguousKVCache, ManualAttention),
    ]
    for variant, cache_cls, attention_cls in cases:
        engine = build_engine(tiny_config, tiny_weights, "cpu", variant)
        assert type(engine.cache) is cache_cls and type(engine.model.attention) is attention_cls
        assert engine.dtype == torch.float32 and engine.device == torch.device("cpu")
        assert engine.lengths == {}  # the warm-up's requests are gone
        if cache_cls is PagedKVCache:
            assert engine.cache.block_size == 64 and engine.cache.table == {}
        if cache_cls is SlabKVCache:
            assert engine.cache.slot_of == {}
            assert sorted(engine.cache.free_slots) == list(range(engine.cache.slots))
