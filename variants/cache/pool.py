"""The token-slot pools behind the slab and paged caches: per layer, [token slots, kv_heads,
head_dim] for K and for V, zeroed, and grown by copying the old pool into a larger one."""

import torch


def grow_pools(spec, device, dtype, token_slots: int, old_k=None, old_v=None):
    """New K and V pools of `token_slots` slots per layer, holding the old pools' contents."""
    shape = (spec.num_layers, token_slots, spec.num_kv_heads, spec.head_dim)
    k = torch.zeros(shape, device=device, dtype=dtype)
    v = torch.zeros(shape, device=device, dtype=dtype)
    if old_k is not None:
        k[:, : old_k.shape[1]] = old_k
        v[:, : old_v.shape[1]] = old_v
    return k, v
