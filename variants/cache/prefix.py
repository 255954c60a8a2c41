"""Paged KV cache with prefix caching: a prompt's full blocks are indexed by a hash chain of their
tokens, so a later prompt that starts the same way maps those blocks instead of computing them.

Wins when requests share a prompt prefix (a system prompt, few-shot examples): the shared blocks
are computed once and held once. Shared blocks are read-only (refcounts); a released block stays
matchable until the free list runs out, then the least recently released one is reused."""

import array
import hashlib
from collections import OrderedDict

from variants.cache.paged import PagedKVCache
from variants.cache.pool import pool_bytes


class PrefixCachedPagedKVCache(PagedKVCache):
    def __init__(self, *args, **kwargs):
        """PagedKVCache's arguments."""
        self.refs: dict = {}  # block -> requests holding it (held blocks only)
        self.hash_of: dict = {}  # block -> chain hash, for indexed blocks (their K/V written)
        self.block_of: dict = {}  # chain hash -> block
        # indexed blocks no request holds, least recently released first: taken only when the
        # free list is empty, so they stay matchable for as long as memory allows
        self.evictable: OrderedDict = OrderedDict()
        super().__init__(*args, **kwargs)

    # ----------------------------------------------------------------- the prefix index
    def block_hashes(self, token_ids: list) -> list:
        """The chain hash of each full block of a prompt: block i's hash covers tokens 0 to
        (i + 1) * block_size - 1, so equal hashes mean equal prefixes (sha256: no collision to
        fear), wherever the blocks sit in the pool."""
        hashes, parent, bs = [], b"", self.block_size
        for start in range(0, len(token_ids) - bs + 1, bs):
            parent = hashlib.sha256(
                parent + array.array("q", token_ids[start : start + bs])
            ).digest()
            hashes.append(parent)
        return hashes

    def allocate_prompt(self, rid: int, length: int, hashes: list) -> int:
        """A new request's table for a prompt of `length` tokens: the indexed blocks of its
        leading full blocks, then fresh ones. Only blocks before the last token match (the call
        computes at least that one, and never writes into a shared block). Returns how many
        tokens it found cached."""
        matched = []
        for h in hashes[: (length - 1) // self.block_size]:
            block = self.block_of.get(h)
            if block is None:
                break
            matched.append(block)
        self.table[rid], self.rows[rid] = [], self._zero_row[:]
        for block in matched:
            self.evictable.pop(block, None)
            self._hold(rid, block)
            self.refs[block] = self.refs.get(block, 0) + 1
        self.extend(rid, length)
        return len(matched) * self.block_size

    def publish(self, rid: int, hashes: list) -> None:
        """Index the request's full prompt blocks (their K/V now written) for later prompts; a
        hash already indexed keeps its block, and this request's copy stays private."""
        for block, h in zip(self.table[rid], hashes):
            if h not in self.block_of:
                self.block_of[h], self.hash_of[block] = block, h

    # ----------------------------------------------------------------- taking and giving back
    def available(self) -> int:
        """Blocks a request can take: the free list, then the evictable ones."""
        return len(self.free_blocks) + len(self.evictable)

    def reserve(self, rids: list, lengths: list, live=None) -> None:
        """Room for the blocks the requests lack beyond what they hold (a decode step's)."""
        table = self.table
        need = sum(
            max(0, self.table_width(n) - len(table.get(r, ()))) for r, n in zip(rids, lengths)
        )
        self._make_room(need)

    def reserve_prompts(self, rids: list, lengths: list) -> None:
        """Room for prompts before any is matched: as many blocks as without prefix caching,
        less the blocks a re-prefilled request holds alone (its shared ones stay held), so a
        call fits or raises CacheFullError, changing nothing, as it would on the paged cache."""
        need = 0
        for rid, n in zip(rids, lengths):
            alone = sum(self.refs[b] == 1 for b in self.table.get(rid, ()))
            need += max(0, self.table_width(n) - alone)
        self._make_room(need)

    def _make_room(self, need: int) -> None:
        """The paged cache's growth rule, counting evictable blocks as free: the pool doubles,
        or grows to what is needed, only when both run short."""
        short, bs = need - self.available(), self.block_size
        if short <= 0:
            return
        held = self.blocks - 1 - self.available()
        blocks = max(2 * self.blocks, self.blocks + short)
        if self.limit_bytes is not None:
            if pool_bytes(self.spec, self.dtype, blocks * bs) > self.limit_bytes:
                blocks = self.blocks + short  # the least that holds them
        # block ids survive growth (the old pool is copied to the same rows): the index stays
        self._grow(blocks, f"{held + need} blocks of {bs} tokens")

    def extend(self, rid: int, length: int) -> None:
        """Make room for `length` tokens in total: fresh blocks, evicting when none is free."""
        blocks = self.table[rid]
        if self.table_width(length) - len(blocks) > self.available():
            self.reserve([rid], [length])
        while len(blocks) * self.block_size < length:
            if self.free_blocks:
                block = self.free_blocks.pop()
            else:
                block, _ = self.evictable.popitem(last=False)
                del self.block_of[self.hash_of.pop(block)]
            self._hold(rid, block)
            self.refs[block] = 1

    def _hold(self, rid: int, block: int) -> None:
        blocks = self.table[rid]
        blocks.append(block)
        self.rows[rid][len(blocks) - 1] = block

    def _drop(self, block: int) -> None:
        self.refs[block] -= 1
        if self.refs[block]:
            return
        del self.refs[block]
        if block in self.hash_of:
            self.evictable[block] = None  # (the newest: evicted last)
        else:
            self.free_blocks.append(block)

    def truncate(self, rid: int, length: int) -> None:
        blocks, row, keep = self.table[rid], self.rows[rid], -(-length // self.block_size)
        while len(blocks) > keep:
            self._drop(blocks.pop())
            row[len(blocks)] = 0

    def release(self, rid: int) -> None:
        """The request's blocks, last first: of a released prompt, the tail is evicted first
        (a block is reachable only through the blocks before it)."""
        del self.rows[rid]
        for block in reversed(self.table.pop(rid)):
            self._drop(block)

    def read_tokens(self, layer: int, slots):
        """K and V of the token slots `slots` ([n] long tensor): [n, kv_heads, head_dim] each."""
        return self.k[layer].index_select(0, slots), self.v[layer].index_select(0, slots)
