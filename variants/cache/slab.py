"""Static slab KV cache (gpt-fast style): one slot of max_positions tokens per live request.

Wins when requests are few and long: a decode batch on consecutive slots reads a plain view,
no gather. Costs slots x max_positions of memory up front; the slab doubles its slots when full.
One extra slot at the end is scratch: padding rows of a CUDA-graph batch write there."""

import array

import torch

from variants.cache.pool import grow_pools
from variants.staging import host_tensor, int_range


class SlabKVCache:
    def __init__(self, spec, device, dtype, capacity_tokens: int):
        self.spec, self.device, self.dtype = spec, device, dtype
        self.max_len = spec.max_positions
        self.slots = 0
        self.k = self.v = None
        self.free_slots: list = []
        self.slot_of: dict = {}
        self.generation = 0  # bumped when the pool is reallocated (captured graphs go stale)
        self._grow(max(1, capacity_tokens // self.max_len))

    def _grow(self, slots: int) -> None:
        if self.k is not None:
            self.generation += 1
        self.k, self.v = grow_pools(
            self.spec, self.device, self.dtype, (slots + 1) * self.max_len, self.k, self.v
        )
        self.free_slots = sorted(self.free_slots + list(range(self.slots, slots)), reverse=True)
        self.slots = slots

    def memory_bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def allocate(self, rid: int, length: int) -> None:
        if not self.free_slots:
            self._grow(self.slots * 2)
        self.slot_of[rid] = self.free_slots.pop()

    def extend(self, rid: int, length: int) -> None:
        """A slot already holds max_positions tokens: nothing to do."""

    def truncate(self, rid: int, length: int) -> None:
        """Nothing to give back: a slot is the request's whatever its length."""

    def release(self, rid: int) -> None:
        self.free_slots.append(self.slot_of.pop(rid))
        self.free_slots.sort(reverse=True)  # lowest slot first keeps batches consecutive

    def token_slots(self, rid: int, start: int, stop: int) -> array.array:
        """The slots of positions [start, stop) as an int64 array (one run in the slot)."""
        base = self.slot_of[rid] * self.max_len
        return int_range(base + start, base + stop)

    def step_slots(self, rids: list, positions: list) -> list:
        """The slot of each request's token at its position (a decode step's writes)."""
        slot_of, n = self.slot_of, self.max_len
        return [slot_of[r] * n + p for r, p in zip(rids, positions)]

    def read_rows(self, rids: list):
        """A slice when the slots are consecutive (a view, no gather), else the slot list."""
        slots = [self.slot_of[r] for r in rids]
        if slots == list(range(slots[0], slots[0] + len(slots))):
            return slice(slots[0], slots[0] + len(slots))
        return host_tensor(slots, torch.long, self.device)

    @property
    def kernel_block_size(self) -> int:
        return self.max_len  # a slab is a paged pool with one max_positions block per slot

    def scratch_token(self) -> int:
        return self.slots * self.max_len

    def table_width(self, max_len: int) -> int:
        return 1

    def table_row(self, rid, width: int) -> list:
        return [self.slots if rid is None else self.slot_of[rid]]

    def graph_rows(self, table: torch.Tensor, max_len: int) -> torch.Tensor:
        return table[:, 0]

    def write(self, layer: int, plan, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer].index_copy_(0, plan.write_index, k)
        self.v[layer].index_copy_(0, plan.write_index, v)

    def read(self, layer: int, plan):
        """K, V as [B, kv_heads, max_len, head_dim] of the batch rows."""
        shape = (self.slots + 1, self.max_len, self.spec.num_kv_heads, self.spec.head_dim)
        k = self.k[layer].view(shape)[:, : plan.max_len]
        v = self.v[layer].view(shape)[:, : plan.max_len]
        return k[plan.rows].transpose(1, 2), v[plan.rows].transpose(1, 2)
