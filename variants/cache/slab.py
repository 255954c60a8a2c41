"""Static slab KV cache (gpt-fast style): one slot per live request, every slot the same length.

Wins when requests are few and long: a decode batch on consecutive slots reads a plain view,
no gather. The first pool holds `capacity_tokens` as up to GRAPH_ROWS slots of at least
FIRST_SLOT_TOKENS (at most max_positions); slots double in length when a request outgrows them
and double in number when all are taken. A new layout that fits the pool's memory is laid out
in place (the live requests' tokens moved within it), and kernels that read the cache find
each row through its table, which holds the slot's first token: graphs of those keep working,
only views of the pool go stale (`layout`). A larger one copies the contents into a new pool
(`generation` tells captured graphs, which capture again: a resize inside a call costs it
milliseconds, so the pool grows with room to spare, and the first size is a searched choice).
One extra slot at the end is scratch: padding rows of a CUDA-graph batch write there."""

import array

import torch

from variants.cache.pool import FIRST_CACHE_TOKENS, first_pool_tokens, new_pools, pool_bytes
from variants.staging import host_tensor, int_range

FIRST_SLOT_TOKENS = 512  # a slot's shortest length
GRAPH_ROWS = 64  # the first pool's most slots: the decode graphs' largest batch


class SlabKVCache:
    def __init__(self, spec, device, dtype, capacity_tokens=FIRST_CACHE_TOKENS, limit_bytes=None):
        """`capacity_tokens`: the first pool's slots x slot length; `limit_bytes`: the most the
        pool may take (None: what the device has)."""
        self.spec, self.device, self.dtype = spec, device, dtype
        self.limit_bytes = limit_bytes
        tokens = first_pool_tokens(spec, dtype, capacity_tokens, limit_bytes)
        self.max_len = self._slot_length(tokens // GRAPH_ROWS)  # tokens a slot holds now
        self.slots = 0
        self.k = self.v = None
        self.free_slots: list = []
        self.slot_of: dict = {}
        self.generation = 0  # bumped when the pool is reallocated (captured graphs go stale)
        self.layout = 0  # bumped when the slots change (views of the pool go stale)
        self._resize(max(1, tokens // self.max_len), self.max_len, "the first pool's token slots")

    def _resize(self, slots: int, slot_len: int, why: str) -> None:
        """A pool of `slots` slots of `slot_len` tokens (plus scratch): in place where the pool
        holds them, else a new one. The live requests move to the first slots, in their old
        order, with their first `slot_len` tokens (a shorter slot holds all its request has), so
        the pool can also hold fewer slots than before."""
        tokens = (slots + 1) * slot_len
        in_place = self.k is not None and tokens <= self.k.shape[1]
        if in_place:
            k, v = self.k, self.v
        else:
            k, v = new_pools(self.spec, self.device, self.dtype, tokens, self.limit_bytes, why)
        live = sorted(self.slot_of, key=self.slot_of.get)
        if self.k is not None and live:
            rest = (self.spec.num_kv_heads, self.spec.head_dim)
            layers, n = self.spec.num_layers, min(self.max_len, slot_len)
            old_slots = torch.tensor([self.slot_of[r] for r in live], device=self.device)
            held = (self.slots + 1) * self.max_len
            for new_pool, old_pool in ((k, self.k), (v, self.v)):
                into = new_pool[:, :tokens].view(layers, slots + 1, slot_len, *rest)
                old = old_pool[:, :held].view(layers, self.slots + 1, self.max_len, *rest)
                # (index_select copies them out first: in place, the slots may overlap)
                into[:, : len(live), :n].copy_(old.index_select(1, old_slots)[:, :, :n])
        if self.k is not None:
            self.generation += not in_place
            self.layout += 1
        self.k, self.v = k, v
        self.slot_of = {rid: i for i, rid in enumerate(live)}
        self.free_slots = list(range(slots - 1, len(live) - 1, -1))
        self.slots, self.max_len = slots, slot_len

    def memory_bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    @property
    def max_context(self) -> int:
        """The longest context a read can return now."""
        return self.max_len

    def reserve(self, rids: list, lengths: list, live=None) -> None:
        """Room for requests `rids` of `lengths` tokens: a new request takes a slot, a live one
        keeps its own. When the pool must change, its slots double in number and never get
        shorter; a slot that is too short grows to the power of two that holds the longest of
        these and of the `live` ones (request id -> tokens held; None: as long as they are) with
        a quarter more to decode into: each change moves the pool and makes the captured graphs
        capture again. Where the limit forbids that, the slots become as long as the requests
        need (shorter, after a long request left), then as many of those as the pool's memory
        held before, then as few as they need (fewer than before if need be). Raises
        CacheFullError, before any request changes, when even that does not fit."""
        longest = max(lengths)
        if len(rids) <= len(self.free_slots) and longest <= self.max_len:
            return  # (the call's usual case, on the hot path: nothing to count)
        held = self.max_len
        if live is not None:
            held = max((n for r, n in live.items() if r not in rids), default=0)
        wanted = max(longest, held)
        shortest = self._slot_length(wanted)
        slot_len = self.max_len if wanted <= self.max_len else self._slot_length(wanted * 5 // 4)
        needed = len(self.slot_of) + sum(1 for rid in rids if rid not in self.slot_of)
        slots = self.slots
        while slots < needed:
            slots *= 2
        if self.limit_bytes is not None:
            same = min(slots, self.k.shape[1] // shortest - 1)  # what the pool holds now
            shapes = ((slots, slot_len), (slots, shortest), (same, shortest), (needed, shortest))

            def fits(slots: int, slot_len: int) -> bool:
                size = pool_bytes(self.spec, self.dtype, (slots + 1) * slot_len)
                return slots >= needed and size <= self.limit_bytes

            # the first that fits; the last (the least that holds them) is new_pools' to refuse
            slots, slot_len = next((shape for shape in shapes if fits(*shape)), shapes[-1])
        if (slots, slot_len) != (self.slots, self.max_len):
            self._resize(slots, slot_len, f"{needed} live requests of up to {wanted} tokens")

    def _slot_length(self, tokens: int) -> int:
        """FIRST_SLOT_TOKENS, doubled until it holds `tokens` (at most max_positions)."""
        most = self.spec.max_positions
        slot_len = min(FIRST_SLOT_TOKENS, most)
        while slot_len < min(tokens, most):
            slot_len = min(2 * slot_len, most)
        return slot_len

    def allocate(self, rid: int, length: int) -> None:
        self.reserve([rid], [length])  # (a free slot that holds it: nothing to do)
        self.slot_of[rid] = self.free_slots.pop()

    def extend_step(self, rids: list, positions: list, live=None) -> None:
        """Room for a decode step: each row's token at its position (`live` as in reserve)."""
        if max(positions) >= self.max_len:
            self.reserve(rids, [p + 1 for p in positions], live)

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

    # A row's one table entry is its slot's first token (None: the scratch slot's), so a kernel
    # needs no slot length (`paged_decode_attention(offsets=True)`).
    table_offsets = True

    @property
    def kernel_block_size(self) -> int:
        return self.spec.max_positions  # (unused with token offsets; one value, one compile)

    def scratch_token(self) -> int:
        return self.slots * self.max_len

    def table_width(self, max_len: int) -> int:
        return 1

    def table_row(self, rid, width: int) -> list:
        return [(self.slots if rid is None else self.slot_of[rid]) * self.max_len]

    def graph_rows(self, table: torch.Tensor, max_len: int) -> torch.Tensor:
        """The rows' slots, for views of the pool (a graph of them follows `layout`)."""
        return torch.div(table[:, 0], self.max_len, rounding_mode="floor")

    def write(self, layer: int, plan, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer].index_copy_(0, plan.write_index, k)
        self.v[layer].index_copy_(0, plan.write_index, v)

    def read(self, layer: int, plan):
        """K, V as [B, kv_heads, max_len, head_dim] of the batch rows."""
        shape = (self.slots + 1, self.max_len, self.spec.num_kv_heads, self.spec.head_dim)
        held = (self.slots + 1) * self.max_len
        k = self.k[layer, :held].view(shape)[:, : plan.max_len]
        v = self.v[layer, :held].view(shape)[:, : plan.max_len]
        return k[plan.rows].transpose(1, 2), v[plan.rows].transpose(1, 2)
