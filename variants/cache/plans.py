"""What a cache hands the engine for one call: where each new token's K/V goes and what to read.

`write_index` is a flat token-slot index per new token (slab and paged pools are both viewed as
[token slots, kv_heads, head_dim]); `kv_lens`/`max_len` bound each decode row's context."""

from dataclasses import dataclass

import torch


@dataclass
class CachePlan:
    rids: list
    write_index: torch.Tensor | None = None  # [new tokens] flat slot per token
    kv_lens: torch.Tensor | None = None  # [B] context length after this call (decode)
    max_len: int = 0  # longest context in the batch (decode)
    uniform: bool = True  # every row has the same context length (no mask needed)
    rows: object = None  # layout-specific read index: slots, slice, or block table
    table: torch.Tensor | None = None  # [B, W] block table, for kernels that read in place
    segments: list | None = None  # (rid, first position, count) per request, in call order
    # the index tensors (and the step's positions) were written before the step's first kernel;
    # False: by that kernel (a graph's inputs kernel), so the kernel after it reads them only
    # after its PDL wait, where the kernels launch with one
    staged: bool = True
