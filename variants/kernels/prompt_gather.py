"""A prefill graph's inputs read where the caller left them, in the graph's first kernel.

Concatenating the prompts into the graph's token buffer (a launch) and copying the metadata
(positions, cache slots, the attention's schedule) from a pinned buffer into the graph's device
buffer (a `cudaMemcpyAsync`) would cost host time every call
(experiments/host_profile.py). Here the host only writes pinned memory, and the kernel:
- copies the metadata from the pinned buffer (mapped, read over the bus) into the device buffer
  the graph's later kernels read;
- gathers each packed row's id from its prompt: row r's id sits at `base + source[r] + r`, with
  `source[r]` (in the pinned buffer) the prompt's distance from any int64 tensor `base`, less
  the prompt's first packed row;
- checks the ids' range (their min and max into pinned memory, mapped, so no copy node: the
  engine's deferred check reads them after its event), and copies each id's embedding row,
  clamped.
Rows from the call's token count on are padding: id 0, not checked."""

import torch
import triton
import triton.language as tl

CHECK_BLOCK = 1024  # ids a pass of the checking program reads
ROWS = 16  # packed rows a program gathers and embeds: its reads of the host buffer are wide
EMBED_COLS = 256  # embedding columns a program copies at a time, for all its rows


@triton.jit
def _gather_embed_kernel(
    host_ptr, meta_ptr, base_ptr, extremes_ptr, embed_ptr, x_ptr, vocab, size, n_at, source_at,
    rows, hidden, stride_e, stride_x,
    BLOCK: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, META_BLOCK: tl.constexpr,
):  # fmt: skip
    """Program p copies its share of the metadata and the embedding rows of packed rows
    [p * ROWS, (p + 1) * ROWS); program 0 also finds the min and max of the call's ids."""
    p = tl.program_id(0).to(tl.int64)
    share = p * META_BLOCK + tl.arange(0, META_BLOCK)
    tl.store(meta_ptr + share, tl.load(host_ptr + share, mask=share < size), mask=share < size)
    # The call's token count, read alongside the sources: each read of the host buffer is a
    # round trip over the bus, so no read waits for another (the loop runs over every row).
    n = tl.load(host_ptr + n_at)
    if p == 0:
        offs = tl.arange(0, BLOCK)
        lo = tl.full([BLOCK], 2**62, tl.int64)
        hi = tl.full([BLOCK], -(2**62), tl.int64)
        for start in range(0, rows, BLOCK):
            inside = start + offs < rows
            source = tl.load(host_ptr + source_at + start + offs, mask=inside, other=0)
            live = start + offs < n
            ids = tl.load(base_ptr + source + start + offs, mask=live, other=0)
            lo = tl.minimum(lo, tl.where(live, ids, 2**62))
            hi = tl.maximum(hi, tl.where(live, ids, -(2**62)))
        tl.store(extremes_ptr, tl.min(lo, axis=0))
        tl.store(extremes_ptr + 1, tl.max(hi, axis=0))
    mine = p * ROWS + tl.arange(0, ROWS)
    inside = mine < rows
    source = tl.load(host_ptr + source_at + mine, mask=inside, other=0)
    token = tl.load(base_ptr + source + mine, mask=mine < n, other=0)
    token = tl.minimum(tl.maximum(token, 0), vocab - 1)
    cols = tl.arange(0, COLS)
    for h0 in range(0, hidden, COLS):
        mask = inside[:, None] & (h0 + cols < hidden)[None, :]
        values = tl.load(embed_ptr + token[:, None] * stride_e + h0 + cols[None, :], mask=mask)
        tl.store(x_ptr + mine[:, None] * stride_x + h0 + cols[None, :], values, mask=mask)


def gather_check_embed(
    host: torch.Tensor, meta: torch.Tensor, base: torch.Tensor, rows: int, n_at: int,
    source_at: int, vocab: int, extremes: torch.Tensor, embed: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """host: int64, pinned (on a GPU) or on the CPU (Triton's interpreter), holding the
    metadata at [0, meta.numel()), the call's token count at n_at and the rows' sources at
    [source_at, source_at + rows); meta: the contiguous int64 device buffer it is copied into;
    base: an int64 tensor on the ids' device. Writes the ids' (min, max) into extremes and
    returns the `rows` embedding rows (ids clamped into [0, vocab)), a new [rows, hidden]
    tensor."""
    assert host.dtype == meta.dtype == base.dtype == torch.long and meta.is_contiguous()
    assert host.numel() >= max(meta.numel(), n_at + 1, source_at + rows)
    assert extremes.dtype == torch.long and extremes.numel() == 2
    assert embed.dim() == 2 and embed.shape[0] >= vocab and embed.stride(1) == 1
    hidden = embed.shape[1]
    x = torch.empty(rows, hidden, device=embed.device, dtype=embed.dtype)
    if rows == 0:
        return x
    size, programs = meta.numel(), triton.cdiv(rows, ROWS)
    _gather_embed_kernel[(programs,)](
        host, meta, base, extremes, embed, x, vocab, size, n_at, source_at, rows, hidden,
        embed.stride(0), x.stride(0), BLOCK=min(CHECK_BLOCK, triton.next_power_of_2(max(rows, 16))),
        ROWS=ROWS, COLS=min(EMBED_COLS, triton.next_power_of_2(hidden)),
        META_BLOCK=triton.next_power_of_2(max(1, triton.cdiv(size, programs))), num_warps=4,
    )  # fmt: skip
    return x


def prompt_sources(prompts: list, base, lengths: list | None = None) -> list:
    """Each prompt's `source` value (its distance from base in int64 elements, less its first
    packed row) and length, in packing order. The prompts: contiguous int64 tensors on base's
    device, held until the kernel is queued (a tensor freed after that goes back to the caching
    allocator for this stream's later work only, which runs after the kernel). `base`: the
    tensor or its address; `lengths`: the prompts' lengths when the caller has them (each
    tensor call costs host time)."""
    origin = base if isinstance(base, int) else base.data_ptr()
    assert lengths is None or len(lengths) == len(prompts), "one length a prompt"
    row, out = 0, []
    for p, n in zip(prompts, lengths or [p.numel() for p in prompts]):
        distance = p.data_ptr() - origin
        assert distance % 8 == 0, "an int64 tensor starts at a multiple of 8 bytes"
        out.append((distance // 8 - row, n))
        row += n
    return out


def gathered_embedding(check, host, meta, base, rows, n_at, source_at, vocab, embed):
    """gather_check_embed with `check` (a DeferredRangeCheck) getting the extremes, then its
    event recorded (none off CUDA: its `error` then reads them at once)."""
    x = gather_check_embed(host, meta, base, rows, n_at, source_at, vocab, check.host, embed)
    if check.event is not None:
        check.record_written()
    return x
