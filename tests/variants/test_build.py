"""build_engine builds a Variant's engine as a trial does: its engine.py rendered into a
temporary folder, imported from there and its create_engine called; the folder goes with the
engine."""

import gc
from pathlib import Path

import torch

from variants import Variant, build_engine
from variants.cache.slab import SlabKVCache


def test_built_engine_has_the_chosen_parts(tiny_config, tiny_weights):
    paged = Variant(cache="paged", block_size=64, attention="manual")
    cases = [
        (paged, "PagedKVCache", "ManualAttention"),
        (Variant(cache="slab"), "SlabKVCache", "SdpaAttention"),
        (Variant(cache="contiguous", attention="manual"), "ContiguousKVCache", "ManualAttention"),
    ]
    for variant, cache_cls, attention_cls in cases:
        engine = build_engine(tiny_config, tiny_weights, "cpu", variant)
        assert type(engine.cache).__name__ == cache_cls
        assert type(engine.model.attention).__name__ == attention_cls
        assert engine.dtype == torch.float32 and engine.device == torch.device("cpu")
        assert engine.lengths == {}  # the warm-up's requests are gone
        if cache_cls == "PagedKVCache":
            assert engine.cache.block_size == 64 and engine.cache.table == {}
        if cache_cls == "SlabKVCache":
            assert engine.cache.slot_of == {}
            assert sorted(engine.cache.free_slots) == list(range(engine.cache.slots))


def test_the_engine_runs_its_rendered_file_which_goes_with_it(tiny_config, tiny_weights):
    engine = build_engine(tiny_config, tiny_weights, "cpu", Variant(cache="slab"))
    path = Path(type(engine.cache).reserve.__code__.co_filename)
    text = path.read_text()
    assert path.name == "engine.py" and text.startswith('"""Standalone inference engine')
    assert "class SlabKVCache" in text and "class PagedKVCache" not in text
    assert type(engine.cache) is not SlabKVCache  # the file's class, not the library's
    del engine
    gc.collect()
    assert not path.parent.exists()
