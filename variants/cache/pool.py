"""The token-slot pools behind the slab and paged caches: per layer, [token slots, kv_heads,
head_dim] for K and for V, zeroed. A pool grows by allocating a larger one and copying (the
caller lays the old contents out). A pool past the engine's limit, or one the host or GPU cannot
hold, is refused with a `CacheFullError` that says how much was asked and why, before any request
changes (Linux would otherwise kill the process; a GPU would raise a bare out-of-memory)."""

import torch

# The first pool's size (tokens) where none is chosen: the course's public traces need a few
# thousand at most (the variant's cache_tokens chooses it).
FIRST_CACHE_TOKENS = 8192


class CacheFullError(MemoryError):
    """The KV cache cannot grow to what a call needs; the engine is as it was before the call."""


def _host_bytes_available() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            found = [line.split()[1] for line in f if line.startswith("MemAvailable:")]
        return int(found[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None


def pool_bytes(spec, dtype, token_slots: int) -> int:
    """K and V of every layer for `token_slots` slots."""
    per_slot = spec.num_layers * spec.num_kv_heads * spec.head_dim
    return 2 * per_slot * token_slots * torch.empty((), dtype=dtype).element_size()


def first_pool_tokens(spec, dtype, tokens: int, limit_bytes) -> int:
    """`tokens`, or where their pool is over `limit_bytes`, what 3/4 of it holds: a first pool
    never takes the whole budget (the graphs and buffers made after it need some)."""
    if limit_bytes is None or pool_bytes(spec, dtype, tokens) <= limit_bytes:
        return tokens
    return max(1, 3 * limit_bytes // 4 // pool_bytes(spec, dtype, 1))


def check_limit(need: int, limit_bytes, why: str) -> None:
    """Raises CacheFullError when `need` bytes of KV cache are over `limit_bytes` (None: no
    limit of the engine's own); `why` names what asked for them."""
    if limit_bytes is not None and need > limit_bytes:
        raise CacheFullError(
            f"KV cache full: {why} need {need / 2**30:.2f} GiB of KV cache, over the "
            f"{limit_bytes / 2**30:.2f} GiB this engine may take (its memory budget, "
            "MEMORY_BUDGET_GIB in engine.py, less its weights and graphs); remove requests or "
            "raise the budget"
        )


def new_pools(spec, device, dtype, token_slots: int, limit_bytes, why: str):
    """Zeroed K and V pools of `token_slots` slots per layer, within `limit_bytes`."""
    need = pool_bytes(spec, dtype, token_slots)
    gib = need / 2**30
    check_limit(need, limit_bytes, why)
    if torch.device(device).type == "cpu":
        free = _host_bytes_available()
        if free is not None and need > 0.8 * free:
            raise CacheFullError(
                f"KV cache full: {why} need {gib:.2f} GiB of KV cache ({token_slots} token "
                f"slots) but only {free / 2**30:.1f} GiB of host memory is available"
            )
    shape = (spec.num_layers, token_slots, spec.num_kv_heads, spec.head_dim)
    try:
        k = torch.zeros(shape, device=device, dtype=dtype)
        return k, torch.zeros_like(k)
    except torch.cuda.OutOfMemoryError:
        raise CacheFullError(
            f"KV cache full: {why} need {gib:.2f} GiB of KV cache ({token_slots} token slots) "
            f"and {device} has no room for it"
        ) from None
