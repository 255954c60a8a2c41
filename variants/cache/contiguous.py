"""Contiguous KV cache: each request owns its own tensors, grown by doubling.

The simplest layout and the baseline: no pool to size, memory proportional to what is live, but
every write and read loops over the requests of the batch (one copy each per layer)."""

import torch

from variants.cache.pool import check_limit, new_pools, pool_bytes


def _capacity(length: int) -> int:
    return 1 << max(length - 1, 0).bit_length()


class ContiguousKVCache:
    def __init__(self, spec, device, dtype, capacity_tokens: int = 0, limit_bytes=None):
        """`limit_bytes`: the most all requests' tensors may take (None: what the device has)."""
        self.spec, self.device, self.dtype = spec, device, dtype
        self.limit_bytes = limit_bytes
        self.store: dict = {}  # rid -> (k, v), each [layers, capacity, kv_heads, head_dim]

    def memory_bytes(self) -> int:
        return sum(2 * k.numel() * k.element_size() for k, _ in self.store.values())

    @property
    def max_context(self) -> int:
        return self.spec.max_positions

    def reserve(self, rids: list, lengths: list, live=None) -> None:
        """Raises CacheFullError, before any request changes, when the tensors requests `rids`
        of `lengths` tokens would grow to take the cache past its limit (`live`: unused, each
        request has tensors of its own)."""
        if self.limit_bytes is None:
            return
        held = {r: self.store[r][0].shape[1] for r in rids if r in self.store}
        more = sum(max(0, _capacity(n) - held.get(r, 0)) for r, n in zip(rids, lengths))
        need = pool_bytes(self.spec, self.dtype, more) + self.memory_bytes()
        check_limit(need, self.limit_bytes, f"{len(set(self.store) | set(rids))} requests")

    def _new(self, rid: int, capacity: int) -> tuple:
        return new_pools(self.spec, self.device, self.dtype, capacity, None, f"request {rid} would")

    def allocate(self, rid: int, length: int) -> None:
        self.reserve([rid], [length])
        self.store[rid] = self._new(rid, _capacity(length))

    def extend(self, rid: int, length: int) -> None:
        k, v = self.store[rid]
        if length > k.shape[1]:
            self.reserve([rid], [length])
            bigger_k, bigger_v = self._new(rid, _capacity(length))
            bigger_k[:, : k.shape[1]] = k
            bigger_v[:, : v.shape[1]] = v
            self.store[rid] = (bigger_k, bigger_v)

    def extend_step(self, rids: list, positions: list, live=None) -> None:
        """Room for a decode step: each row's token at its position."""
        self.reserve(rids, [p + 1 for p in positions])
        for r, p in zip(rids, positions):
            self.extend(r, p + 1)

    def truncate(self, rid: int, length: int) -> None:
        """Capacity only grows (a copy to shrink would cost more than the memory it frees)."""

    def release(self, rid: int) -> None:
        del self.store[rid]

    def token_slots(self, rid: int, start: int, stop: int) -> range:
        return range(start, stop)  # positions inside the request's own tensor

    def step_slots(self, rids: list, positions: list) -> list:
        return list(positions)

    def read_rows(self, rids: list) -> list:
        return list(rids)

    def write(self, layer: int, plan, k: torch.Tensor, v: torch.Tensor) -> None:
        offset = 0
        for rid, start, count in plan.segments:
            ck, cv = self.store[rid]
            ck[layer, start : start + count] = k[offset : offset + count]
            cv[layer, start : start + count] = v[offset : offset + count]
            offset += count

    def read(self, layer: int, plan):
        batch, n = len(plan.rows), plan.max_len
        shape = (batch, n, self.spec.num_kv_heads, self.spec.head_dim)
        k = torch.zeros(shape, device=self.device, dtype=self.dtype)
        v = torch.zeros(shape, device=self.device, dtype=self.dtype)
        for i, rid in enumerate(plan.rows):
            ck, cv = self.store[rid]
            m = min(n, ck.shape[1])
            k[i, :m] = ck[layer, :m]
            v[i, :m] = cv[layer, :m]
        return k.transpose(1, 2), v.transpose(1, 2)
