"""new_pools: zeroed pools of the asked size, refused with a CacheFullError (that names what
asked, how much and the limit) past the engine's limit or the host's available memory."""

import pytest
import torch

import variants.cache.pool as pool
from variants.cache.pool import CacheFullError, new_pools, pool_bytes
from variants.spec import ModelSpec


def test_pools_are_zeroed_and_sized(tiny_config):
    spec = ModelSpec.from_config(tiny_config)
    k, v = new_pools(spec, torch.device("cpu"), torch.float32, 8, None, "a test")
    assert k.shape == v.shape == (spec.num_layers, 8, spec.num_kv_heads, spec.head_dim)
    assert not k.any() and not v.any() and k.data_ptr() != v.data_ptr()
    assert pool_bytes(spec, torch.float32, 8) == 2 * k.numel() * 4


def test_a_pool_past_the_engine_limit_is_refused(tiny_config):
    spec = ModelSpec.from_config(tiny_config)
    limit = pool_bytes(spec, torch.float16, 100)
    k, _ = new_pools(spec, torch.device("cpu"), torch.float16, 100, limit, "a test")
    assert k.shape[1] == 100
    with pytest.raises(CacheFullError, match=r"^KV cache full: 3 requests need .* GiB .* over"):
        new_pools(spec, torch.device("cpu"), torch.float16, 101, limit, "3 requests")
    assert issubclass(CacheFullError, MemoryError)


def test_a_host_pool_beyond_available_memory_is_refused(tiny_config, monkeypatch):
    spec = ModelSpec.from_config(tiny_config)
    per_slot = pool_bytes(spec, torch.float32, 1)
    monkeypatch.setattr(pool, "_host_bytes_available", lambda: 100 * per_slot)
    k, _ = new_pools(spec, torch.device("cpu"), torch.float32, 80, None, "a test")
    assert k.shape[1] == 80  # within 80% of 100 slots
    with pytest.raises(CacheFullError, match=r"\(81 token slots\) .* available"):
        new_pools(spec, torch.device("cpu"), torch.float32, 81, None, "a test")


def test_host_memory_is_read_from_meminfo():
    free = pool._host_bytes_available()
    assert free is None or free > 2**20
