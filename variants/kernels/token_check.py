"""A graph step's inputs in one kernel: the token-range check, the clamp and the embedding.
The ids' min and max go straight into pinned host memory (mapped, so no copy node), the ids are
clamped into the vocabulary in place, and their embedding rows are gathered. Replaces, at the
head of a decode or prefill graph, the min/max kernel, its device-to-host copy, the clamp
(deferred_check.py) and the embedding gather: the step's first layer kernel then starts about
3.5 us after the graph does on the H200, against 25 with those launches and the copy node
(scripts/step_timeline.py).
A component of the Triton layer stacks (the torch stack keeps torch's launches). Needs CUDA
(or Triton's interpreter)."""

import torch
import triton
import triton.language as tl

CHECK_BLOCK = 1024  # ids a pass of the checking program reads
EMBED_BLOCK = 1024  # embedding columns a program copies at a time


@triton.jit
def _check_clamp(tokens_ptr, n, vocab, extremes_ptr, BLOCK: tl.constexpr):
    """The raw ids' min and max into extremes_ptr, the ids clamped into [0, vocab) in place."""
    offs = tl.arange(0, BLOCK)
    lo = tl.full([BLOCK], 2**62, tl.int64)
    hi = tl.full([BLOCK], -(2**62), tl.int64)
    for start in range(0, n, BLOCK):
        mask = start + offs < n
        ids = tl.load(tokens_ptr + start + offs, mask=mask, other=0)
        lo = tl.minimum(lo, tl.where(mask, ids, 2**62))
        hi = tl.maximum(hi, tl.where(mask, ids, -(2**62)))
        tl.store(tokens_ptr + start + offs, tl.minimum(tl.maximum(ids, 0), vocab - 1), mask=mask)
    tl.store(extremes_ptr, tl.min(lo, axis=0))
    tl.store(extremes_ptr + 1, tl.max(hi, axis=0))


@triton.jit
def _check_embed_kernel(
    tokens_ptr, n, vocab, extremes_ptr, embed_ptr, x_ptr, hidden, stride_e, stride_x,
    BLOCK: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """Program r copies the embedding row of id r, clamped; program 0 also checks and clamps
    the ids in place. Another program may read an id before or after program 0 clamps it:
    it clamps what it reads itself, so either gives the same row."""
    r = tl.program_id(0).to(tl.int64)
    if r == 0:
        _check_clamp(tokens_ptr, n, vocab, extremes_ptr, BLOCK)
    row = tl.minimum(tl.maximum(tl.load(tokens_ptr + r), 0), vocab - 1)
    cols = tl.arange(0, BLOCK_H)
    for h0 in range(0, hidden, BLOCK_H):
        mask = h0 + cols < hidden
        values = tl.load(embed_ptr + row * stride_e + h0 + cols, mask=mask)
        tl.store(x_ptr + r * stride_x + h0 + cols, values, mask=mask)


def check_clamp_embed(
    tokens: torch.Tensor, vocab: int, extremes: torch.Tensor, embed: torch.Tensor
) -> torch.Tensor:
    """tokens: 1-D int64, contiguous; extremes: 2 int64, on the device or pinned on the host;
    embed: [vocab, hidden], unit column stride. Writes the raw ids' (min, max) into extremes,
    clamps the ids into [0, vocab) in place and returns the clamped ids' embedding rows, a new
    [N, hidden] tensor."""
    assert tokens.dtype == torch.long and tokens.dim() == 1 and tokens.is_contiguous()
    assert extremes.dtype == torch.long and extremes.numel() == 2
    assert embed.dim() == 2 and embed.shape[0] >= vocab and embed.stride(1) == 1
    n, hidden = tokens.numel(), embed.shape[1]
    x = torch.empty(n, hidden, device=embed.device, dtype=embed.dtype)
    if n == 0:
        return x
    block = min(CHECK_BLOCK, triton.next_power_of_2(max(n, 16)))
    block_h = min(EMBED_BLOCK, triton.next_power_of_2(hidden))
    _check_embed_kernel[(n,)](
        tokens, n, vocab, extremes, embed, x, hidden, embed.stride(0), x.stride(0),
        BLOCK=block, BLOCK_H=block_h, num_warps=4,
    )  # fmt: skip
    return x


def checked_embedding(check, tokens: torch.Tensor, vocab: int, embed: torch.Tensor):
    """A graph body's embedded ids, from its static buffer: `check` (a DeferredRangeCheck)
    gets the extremes from this kernel, then records its event; the ids are clamped in place.
    Off CUDA (no event to record) the check's own min/max, a clamp and a gather instead."""
    if check.event is None:
        check.start(tokens)
        return embed[torch.clamp(tokens, 0, vocab - 1, out=tokens)]
    x = check_clamp_embed(tokens, vocab, check.host, embed)
    check.record_written()
    return x
