"""grow_pools: the new pools have the asked size, keep the old contents, and are zero beyond."""

import torch

from variants.cache.pool import grow_pools
from variants.spec import ModelSpec


def test_grow_keeps_contents_and_zeroes_the_rest(tiny_config):
    spec = ModelSpec.from_config(tiny_config)
    k, v = grow_pools(spec, torch.device("cpu"), torch.float32, 8)
    assert k.shape == (spec.num_layers, 8, spec.num_kv_heads, spec.head_dim) and not k.any()
    k.normal_()
    v.normal_()
    k2, v2 = grow_pools(spec, torch.device("cpu"), torch.float32, 20, k, v)
    assert k2.shape[1] == 20 and v2.shape[1] == 20
    assert torch.equal(k2[:, :8], k) and torch.equal(v2[:, :8], v)
    assert not k2[:, 8:].any() and not v2[:, 8:].any()
    assert k2.data_ptr() != k.data_ptr()


def test_a_host_pool_beyond_available_memory_is_refused(tiny_config, monkeypatch):
    import pytest

    import variants.cache.pool as pool

    spec = ModelSpec.from_config(tiny_config)
    per_slot = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 4  # K and V, float32
    monkeypatch.setattr(pool, "_host_bytes_available", lambda: 100 * per_slot)
    k, _ = grow_pools(spec, torch.device("cpu"), torch.float32, 80)  # within 80% of 100 slots
    assert k.shape[1] == 80
    with pytest.raises(MemoryError, match=r"81 token slots .* available"):
        grow_pools(spec, torch.device("cpu"), torch.float32, 81)


def test_host_memory_is_read_from_meminfo():
    from variants.cache.pool import _host_bytes_available

    free = _host_bytes_available()
    assert free is None or free > 2**20
