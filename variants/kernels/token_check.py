"""A step's token-range check and clamp in one kernel: the ids' min and max, written straight
into pinned host memory (mapped, so no copy node), and the ids clamped into the vocabulary in
place. Replaces, at the head of a decode or prefill graph, the min/max kernel, its
device-to-host copy and the clamp (deferred_check.py): the step's first layer kernel then
started 8 us after the graph did, not 25 (docs/PERF.md, runs 148 and 151). A component of the
Triton layer stacks (the torch stack keeps torch's three launches). Needs CUDA (or Triton's
interpreter)."""

import torch
import triton
import triton.language as tl

CHECK_BLOCK = 1024  # ids a pass of the single program reads


@triton.jit
def _check_clamp_kernel(tokens_ptr, n, vocab, extremes_ptr, BLOCK: tl.constexpr):
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


def check_and_clamp(tokens: torch.Tensor, vocab: int, extremes: torch.Tensor) -> torch.Tensor:
    """tokens: 1-D int64, contiguous; extremes: 2 int64, on the device or pinned on the host.
    Writes the ids' (min, max) into extremes and clamps the ids into [0, vocab) in place;
    returns tokens."""
    assert tokens.dtype == torch.long and tokens.dim() == 1 and tokens.is_contiguous()
    assert extremes.dtype == torch.long and extremes.numel() == 2
    n = tokens.numel()
    block = min(CHECK_BLOCK, triton.next_power_of_2(max(n, 16)))
    _check_clamp_kernel[(1,)](tokens, n, vocab, extremes, BLOCK=block, num_warps=4)
    return tokens


def checked_ids(check, tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """A graph body's ids, range-checked and clamped in place: `check` (a DeferredRangeCheck)
    gets the extremes from this kernel, then records its event. Off CUDA (no event to record)
    the check's own min/max and a clamp instead."""
    if check.event is None:
        check.start(tokens)
        return torch.clamp(tokens, 0, vocab - 1, out=tokens)
    check_and_clamp(tokens, vocab, check.host)
    check.record()
    return tokens
