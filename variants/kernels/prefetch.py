"""Prefetch into L2: a kernel asks for bytes it (or the next kernel) will read later, without
waiting for them or holding registers, so the later reads hit L2 instead of HBM.

A decode step at this model's size is a chain of short phases, each waiting on a few HBM round
trips for its weights; the HBM itself sits mostly idle. A layer's weights (19 MB at the public
size) fit the L2 of the GPUs we target (50 MB on Hopper, 6 MB on an RTX 3090: there only part
of them stay). The prefetch is PTX `prefetch.global.L2`, one 128-byte line a lane; Triton's
interpreter cannot run inline PTX, so callers make it a constexpr choice off there."""

import triton
import triton.language as tl

LINE = tl.constexpr(128)  # bytes


@triton.jit
def prefetch_l2(ptr, nbytes, part, parts, LANES: tl.constexpr):
    """Prefetch part `part` of `parts` of the bytes [ptr, ptr + nbytes) into L2."""
    lines = tl.cdiv(nbytes, LINE)
    per_part = tl.cdiv(lines, parts)
    lo = part * per_part
    hi = tl.minimum(lo + per_part, lines)
    base = ptr.to(tl.pointer_type(tl.int8))
    for l0 in range(lo, hi, LANES):
        line = tl.minimum(l0 + tl.arange(0, LANES), hi - 1)  # past the end: the last line again
        prefetch_at(base + line.to(tl.int64) * LINE)


@triton.jit
def prefetch_at(ptrs):
    """Prefetch the line of each pointer of a tensor of pointers into L2."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False,
        pack=1,
    )  # fmt: skip


@triton.jit
def prefetch_rows(w_ptr, first_row, rows, stride_wn, part, parts, LANES: tl.constexpr):
    """Prefetch part `part` of `parts` of the weight rows [first_row, first_row + rows) into L2
    (whole rows of stride_wn elements, one after another in memory)."""
    elem: tl.constexpr = w_ptr.dtype.element_ty.primitive_bitwidth // 8
    prefetch_l2(w_ptr + first_row * stride_wn, rows * stride_wn * elem, part, parts, LANES)
