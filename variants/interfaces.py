"""Where components meet: the typed interfaces of a KV cache, an attention backend, a layer stack,
an execution mode and a runner. A new component implements one of them;
tests/variants/test_interfaces.py checks every registered one against it. Typing only: the
written engine does not import this."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class KVCache(Protocol):
    """K and V of every live request, per layer. Token positions map to cache slots; a call
    that needs room asks `reserve`/`extend_step` first (CacheFullError leaves it unchanged)."""

    limit_bytes: int | None  # the most its pools may hold (None: the device's memory)

    def memory_bytes(self) -> int: ...
    def max_context(self) -> int: ...
    def reserve(self, rids: list, lengths: list, live: dict | None = None) -> None: ...
    def allocate(self, rid: int, length: int) -> None: ...
    def extend_step(self, rids: list, positions: list, live: dict | None = None) -> None: ...
    def truncate(self, rid: int, length: int) -> None: ...
    def release(self, rid: int) -> None: ...
    def token_slots(self, rid: int, start: int, stop: int): ...
    def step_slots(self, rids: list, positions: list) -> list: ...
    def read_rows(self, rids: list): ...
    def write(self, layer: int, plan, k: torch.Tensor, v: torch.Tensor) -> None: ...
    def read(self, layer: int, plan) -> tuple: ...


@runtime_checkable
class InPlaceKVCache(KVCache, Protocol):
    """A cache an attention kernel reads in place through a block table (slab, paged)."""

    generation: int  # changes when the pools move (captured graphs then capture again)
    table_offsets: bool  # a table entry is a row's first token slot, not a block number

    def kernel_block_size(self) -> int: ...
    def scratch_token(self) -> int: ...
    def table_width(self, max_len: int) -> int: ...
    def table_row(self, rid: int, width: int): ...
    def graph_rows(self, table: torch.Tensor, max_len: int) -> torch.Tensor: ...


@runtime_checkable
class Attention(Protocol):
    """Prefill over a call's packed prompts (`batch`: variants/attention/padding.py) and one
    decode step over the cache (`plan`: variants/cache/plans.py). `reads_cache_in_place`: it
    takes the cache's block table instead of a gathered copy (needs an InPlaceKVCache)."""

    reads_cache_in_place: bool

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch) -> torch.Tensor: ...

    def decode_from_cache(
        self, q: torch.Tensor, cache: KVCache, layer: int, plan
    ) -> torch.Tensor: ...


@runtime_checkable
class InPlaceAttention(Attention, Protocol):
    def graph_contexts(self, max_positions: int, device) -> list:
        """The context buckets its decode graphs are captured at."""
        ...

    def block_table(self, cache: InPlaceKVCache, rids: list, max_len: int, device) -> torch.Tensor:
        """The rows' block tables for an eager decode step (`plan.table`)."""
        ...

    def prefill_block_m(self, tokens: int, head_dim: int, capability: tuple) -> int:
        """The q-block rows its prefill of `tokens` packed tokens launches with (the prefill
        graphs build a bucket's q-block schedule for them)."""
        ...


@runtime_checkable
class PrefillRunner(Protocol):
    """How a prefill call's forward pass runs (engine.py's EagerRunner, or CUDA graphs). The
    engine validates the call, asks `stage` for its ids in the form `prefill` takes, makes room
    in the cache, then calls `prefill`; if that room or the pass fails, `abandon`.
    `check_ids`: the runner starts the deferred range check of ids it stages unchecked."""

    check_ids: bool

    def stage(self, rids: list, prompts: list, lengths: list, deferred: bool): ...
    def abandon(self) -> None: ...
    def prefill(self, rids: list, lengths: list, tokens) -> torch.Tensor: ...


@runtime_checkable
class DecodeRunner(Protocol):
    """How a decode step runs once the cache has room: [B, vocab] float32 logits, fresh."""

    check_ids: bool

    def decode(self, rids: list, tokens: torch.Tensor, positions: list) -> torch.Tensor: ...


# `layers(model, x, positions, cache, plan, batch) -> x`: the decoder layers a Model is built
# with, over the embedded tokens x [N, hidden] (updated in place), `batch` None at decode.
LayerStack = Callable[..., torch.Tensor]
# `wrap(fn) -> fn`: how the layer math runs where it is not eager (torch.compile).
ExecutionMode = Callable[[Callable], Callable]
