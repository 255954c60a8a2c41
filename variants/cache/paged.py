"""Paged KV cache (vLLM style): fixed-size blocks from one pool, a block table per request.

Wins on memory: a request holds ceil(len / block_size) blocks, freed blocks return to the pool,
so many short requests fit where a slab would reserve a whole slot each. Reads gather the
blocks of the batch. The pool starts at the engine's first size and doubles (at least to what a
call needs) when it runs out, copying its blocks; `generation` tells captured graphs. Block 0
is scratch: never handed out, it pads block tables and takes the writes of CUDA-graph padding
rows."""

import array

import torch

from variants.cache.pool import FIRST_CACHE_TOKENS, first_pool_tokens, new_pools, pool_bytes
from variants.staging import host_tensor, int_range


class PagedKVCache:
    def __init__(self, spec, device, dtype, capacity_tokens: int = FIRST_CACHE_TOKENS,
                 block_size: int = 16, limit_bytes=None):  # fmt: skip
        """`capacity_tokens`: the first pool's size; `limit_bytes`: the most the pool may take
        (None: what the device has)."""
        self.spec, self.device, self.dtype = spec, device, dtype
        self.block_size, self.limit_bytes = block_size, limit_bytes
        self.blocks = 0
        self.k = self.v = None
        self.free_blocks: list = []
        self.table: dict = {}
        # Each request's table row at full width (max_positions), padded with block 0, kept as
        # the blocks change: a graph call stages rows by slicing these (C copies), not by
        # building lists, several times slower (experiments/bench_host_fill.py).
        self.rows: dict = {}
        self._zero_row = array.array("q", [0]) * self.table_width(spec.max_positions)
        self.generation = 0  # bumped when the pool is reallocated (captured graphs go stale)
        tokens = first_pool_tokens(spec, dtype, capacity_tokens, limit_bytes)
        self._grow(1 + max(1, -(-tokens // block_size)), "the first pool's token slots")

    def _grow(self, blocks: int, why: str) -> None:
        k, v = new_pools(
            self.spec, self.device, self.dtype, blocks * self.block_size, self.limit_bytes, why
        )
        if self.k is not None:
            k[:, : self.k.shape[1]] = self.k
            v[:, : self.v.shape[1]] = self.v
            self.generation += 1
        self.k, self.v = k, v
        first_new = max(self.blocks, 1)  # block 0 stays scratch
        self.free_blocks = list(range(blocks - 1, first_new - 1, -1)) + self.free_blocks
        self.blocks = blocks

    def memory_bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    @property
    def max_context(self) -> int:
        """The longest context a read can return (any, up to max_positions)."""
        return self.spec.max_positions

    def reserve(self, rids: list, lengths: list, live=None) -> None:
        """Room for requests `rids` of `lengths` tokens: a new request's blocks, or the blocks a
        live one lacks (a re-prefill keeps what it holds: enough either way). The pool doubles,
        or grows to what is needed, (or raises CacheFullError) before any request changes.
        (`live`: unused, a block holds what it holds.)"""
        free, bs = len(self.free_blocks), self.block_size
        if sum(lengths) // bs + len(rids) <= free:
            return  # (at most that many blocks: the call's usual case, on the hot path)
        table = self.table
        need = sum(
            max(0, self.table_width(n) - len(table.get(r, ()))) for r, n in zip(rids, lengths)
        )
        if need > free:
            least = self.blocks + need - free  # the least that holds them
            blocks = max(2 * self.blocks, least)
            limit = self.limit_bytes
            if limit is not None and pool_bytes(self.spec, self.dtype, blocks * bs) > limit:
                blocks = least
            self._grow(blocks, f"{least - 1} blocks of {bs} tokens")

    def allocate(self, rid: int, length: int) -> None:
        self.table[rid] = []
        self.rows[rid] = self._zero_row[:]
        self.extend(rid, length)

    def extend(self, rid: int, length: int) -> None:
        """Make room for `length` tokens in total (at most max_positions)."""
        blocks, row = self.table[rid], self.rows[rid]
        if self.table_width(length) - len(blocks) > len(self.free_blocks):
            self.reserve([rid], [length])
        while len(blocks) * self.block_size < length:
            blocks.append(self.free_blocks.pop())
            row[len(blocks) - 1] = blocks[-1]

    def extend_step(self, rids: list, positions: list, live=None) -> None:
        """Room for a decode step: a new block for each row whose token starts one (a row of n
        tokens holds ceil(n / block_size) blocks, so only a position on a block boundary can)."""
        table, bs = self.table, self.block_size
        starting = [
            (r, p) for r, p in zip(rids, positions) if not p % bs and p >= len(table[r]) * bs
        ]
        if starting:
            if len(starting) > len(self.free_blocks):  # (raises before any row changes)
                self.reserve([r for r, _ in starting], [p + 1 for _, p in starting])
            for r, p in starting:
                self.extend(r, p + 1)

    def truncate(self, rid: int, length: int) -> None:
        """Give back the blocks past `length` tokens (a refused decode's new block)."""
        blocks, row, keep = self.table[rid], self.rows[rid], self.table_width(length)
        while len(blocks) > keep:
            self.free_blocks.append(blocks.pop())
            row[len(blocks)] = 0

    def release(self, rid: int) -> None:
        del self.rows[rid]
        self.free_blocks.extend(reversed(self.table.pop(rid)))

    def token_slots(self, rid: int, start: int, stop: int) -> array.array:
        """The slots of positions [start, stop) as an int64 array: one run of consecutive slots
        per block, each a slice of a cached run (int_range), not a loop over positions."""
        blocks, bs = self.table[rid], self.block_size
        slots = array.array("q")
        p = start
        while p < stop:
            block, offset = divmod(p, bs)
            run = min(stop - p, bs - offset)
            first = blocks[block] * bs + offset
            slots += int_range(first, first + run)
            p += run
        return slots

    def step_slots(self, rids: list, positions: list) -> list:
        """The slot of each request's token at its position (a decode step's writes), in one
        call: a token_slots call a row would pay its call overhead once per row."""
        table, bs = self.table, self.block_size
        return [table[r][p // bs] * bs + p % bs for r, p in zip(rids, positions)]

    def read_rows(self, rids: list) -> torch.Tensor:
        """The block table of the batch, padded with block 0 (masked out by the lengths)."""
        tables = [self.table[r] for r in rids]
        width = max(len(t) for t in tables)
        return host_tensor([t + [0] * (width - len(t)) for t in tables], torch.long, self.device)

    table_offsets = False  # its table holds block numbers

    @property
    def kernel_block_size(self) -> int:
        return self.block_size

    def scratch_token(self) -> int:
        return 0

    def table_width(self, max_len: int) -> int:
        return -(-max_len // self.block_size)

    def table_row(self, rid, width: int) -> array.array:
        """The first `width` blocks of the request (None: a padding row), padded with block 0.
        At full width it is the cache's own row, not a copy: read it, do not change it."""
        row = self._zero_row if rid is None else self.rows[rid]
        return row if width == len(row) else row[:width]

    def graph_rows(self, table: torch.Tensor, max_len: int) -> torch.Tensor:
        return table[:, : self.table_width(max_len)]

    def write(self, layer: int, plan, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer].index_copy_(0, plan.write_index, k)
        self.v[layer].index_copy_(0, plan.write_index, v)

    def read(self, layer: int, plan):
        """Gathers the batch's blocks into [B, kv_heads, max_len, head_dim]."""
        shape = (self.blocks, self.block_size, self.spec.num_kv_heads, self.spec.head_dim)
        batch = plan.rows.shape[0]
        k = self.k[layer].view(shape)[plan.rows].view(batch, -1, *shape[2:])[:, : plan.max_len]
        v = self.v[layer].view(shape)[plan.rows].view(batch, -1, *shape[2:])[:, : plan.max_len]
        return k.transpose(1, 2), v.transpose(1, 2)
