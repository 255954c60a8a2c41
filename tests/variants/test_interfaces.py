"""Every registered component implements its interface (variants/interfaces.py)."""

import importlib

import pytest
import torch

from variants.components import ATTENTION, CACHES, COMPILE, SDPA_PINNED, STACKS
from variants.interfaces import (
    Attention,
    DecodeRunner,
    InPlaceAttention,
    InPlaceKVCache,
    KVCache,
    PrefillRunner,
)
from variants.spec import ModelSpec
from variants.variant import Variant

IN_PLACE_CACHES = {"slab", "paged", "prefix"}
# the prefix-caching assembly's cache (an opt-in, not a searched choice)
ALL_CACHES = {**CACHES, "prefix": "variants.cache.prefix:PrefixCachedPagedKVCache"}


def resolve(path: str):
    """The library's component at `module:name`."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def _load(path: str):
    if "triton" in path:
        pytest.importorskip("triton")
    return resolve(path)


@pytest.mark.parametrize("name", sorted(ALL_CACHES))
def test_every_cache_is_a_kv_cache(name, tiny_config):
    spec = ModelSpec.from_config(tiny_config)
    cls = _load(ALL_CACHES[name])
    extra = {"block_size": 16} if name in ("paged", "prefix") else {}
    cache = cls(spec, torch.device("cpu"), torch.float32, 64, **extra)
    assert isinstance(cache, KVCache)
    assert isinstance(cache, InPlaceKVCache) == (name in IN_PLACE_CACHES)


@pytest.mark.parametrize("name", sorted([*ATTENTION, "sdpa-pinned"]))
def test_every_attention_is_an_attention(name, tiny_config):
    spec = ModelSpec.from_config(tiny_config)
    if name == "sdpa-pinned":
        attention = _load(SDPA_PINNED)(spec, torch.float32, "math")
    else:
        attention = _load(ATTENTION[name])(spec, torch.float32)
    assert isinstance(attention, Attention)
    # one that reads the cache in place says at which contexts its graphs are captured
    assert isinstance(attention, InPlaceAttention) == attention.reads_cache_in_place


def test_stacks_and_execution_modes_are_callables():
    for path in [*STACKS.values(), COMPILE]:
        assert callable(_load(path)), path


def test_a_cache_without_release_is_not_a_kv_cache(tiny_config):
    """The check can fail: a cache that cannot give a request's slots back is refused."""
    spec = ModelSpec.from_config(tiny_config)
    full = resolve(CACHES["slab"])(spec, torch.device("cpu"), torch.float32, 64)

    class Leaky:
        pass

    for name in dir(full):
        if not name.startswith("__") and name != "release":
            setattr(Leaky, name, getattr(full, name))
    assert not isinstance(Leaky(), KVCache)


def test_every_runner_is_a_runner(tiny_config, tiny_weights, library_engine):
    """The eager runner runs both calls; each graph runner one (on the CPU: built, not captured,
    with a Triton attention's in-place reads)."""
    pytest.importorskip("triton")
    from variants.execution.cuda_graphs import DecodeGraphs
    from variants.execution.prefill_graphs import PrefillGraphs

    engine = library_engine(tiny_config, tiny_weights, "cpu", Variant(attention="triton"))
    assert isinstance(engine.eager, PrefillRunner) and isinstance(engine.eager, DecodeRunner)
    assert engine.prefill_runner is engine.decode_runner is engine.eager
    decode = DecodeGraphs(engine, "pow2", largest_batch=4)
    prefill = PrefillGraphs(engine, largest_tokens=64, most_prompts=4)
    assert isinstance(decode, DecodeRunner) and not isinstance(decode, PrefillRunner)
    assert isinstance(prefill, PrefillRunner) and not isinstance(prefill, DecodeRunner)
