"""Contiguous KV cache: each request owns its own tensors, grown by doubling.

The simplest layout and the baseline: no pool to size, memory proportional to what is live, but
every write and read loops over the requests of the batch (one copy each per layer)."""

import torch


class ContiguousKVCache:
    def __init__(self, spec, device, dtype, capacity_tokens: int = 0):
        self.spec, self.device, self.dtype = spec, device, dtype
        self.store: dict = {}  # rid -> (k, v), each [layers, capacity, kv_heads, head_dim]

    def _empty(self, capacity: int) -> torch.Tensor:
        shape = (self.spec.num_layers, capacity, self.spec.num_kv_heads, self.spec.head_dim)
        return torch.zeros(shape, device=self.device, dtype=self.dtype)

    def memory_bytes(self) -> int:
        return sum(2 * k.numel() * k.element_size() for k, _ in self.store.values())

    def allocate(self, rid: int, length: int) -> None:
        capacity = 1 << max(length - 1, 0).bit_length()
        self.store[rid] = (self._empty(capacity), self._empty(capacity))

    def extend(self, rid: int, length: int) -> None:
        k, v = self.store[rid]
        if length > k.shape[1]:
            capacity = 1 << (length - 1).bit_length()
            bigger_k, bigger_v = self._empty(capacity), self._empty(capacity)
            bigger_k[:, : k.shape[1]] = k
            bigger_v[:, : v.shape[1]] = v
            self.store[rid] = (bigger_k, bigger_v)

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
