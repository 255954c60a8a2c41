"""The token-slot pools behind the slab and paged caches: per layer, [token slots, kv_heads,
head_dim] for K and for V, zeroed, and grown by copying the old pool into a larger one. On the
host a pool that would not fit in the available memory is refused with a MemoryError (Linux
would otherwise kill the process); on a GPU torch's out-of-memory error says it."""

import torch


def _host_bytes_available() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def grow_pools(spec, device, dtype, token_slots: int, old_k=None, old_v=None):
    """New K and V pools of `token_slots` slots per layer, holding the old pools' contents."""
    shape = (spec.num_layers, token_slots, spec.num_kv_heads, spec.head_dim)
    if torch.device(device).type == "cpu":
        need = 2 * torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        free = _host_bytes_available()
        if free is not None and need > 0.8 * free:
            raise MemoryError(
                f"the KV cache needs {need / 2**30:.1f} GiB for {token_slots} token slots "
                f"but only {free / 2**30:.1f} GiB of host memory is available"
            )
    k = torch.zeros(shape, device=device, dtype=dtype)
    v = torch.zeros(shape, device=device, dtype=dtype)
    if old_k is not None:
        k[:, : old_k.shape[1]] = old_k
        v[:, : old_v.shape[1]] = old_v
    return k, v
