"""A prefill's projection (64 to a few thousand rows) as one tiled kernel: out = x @ W.T, the
reduction optionally split over K, for the launches where the kernel search times it faster than
cuBLAS.

At a prefill of 128-512 tokens a 1B model's projections sit near the ridge between their
weight's read and their FLOPs, and the narrow ones (the output and down projections: 2048
columns) have few 128 x 128 output tiles for 132 SMs. Here the launch is the search's: the row
tile (up to all rows in one, so the weight is read once), the column tile, the reduction chunk,
warps, stages and the splits that put a program on every SM. Row tiles are the grid's fastest
axis, so the programs that share a weight tile run together and read it once through L2.
Rounding as F.linear's: float32 products and sums, cast once to the weight's dtype; the splits'
partials are summed in split order (`split_k.py`), so a result never depends on which program
came last. Needs Triton >= 3.0."""

import torch
import triton
import triton.language as tl

from variants.kernels.split_k import (
    arrive_last,
    counters_for,
    host_cdiv,
    reset_counter,
    split_range,
    split_workspace,
    store_partial,
    sum_partials,
)

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages), split_k: a launch the search may time
WIDE_TILES = (
    (64, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 128, 128, 4, 3), (64, 256, 64, 8, 4),
    (128, 64, 64, 4, 4), (128, 128, 64, 4, 4), (128, 128, 64, 8, 4), (128, 128, 128, 8, 3),
    (128, 256, 64, 8, 3), (256, 64, 64, 8, 4), (256, 128, 64, 8, 3),
)  # fmt: skip
WIDE_SPLITS = (1, 2, 4, 8)
SHARED_MEMORY_LIMIT = 227 * 1024  # Hopper's per block; the launcher skips what does not fit


@triton.jit(do_not_specialize=["row_tiles"])  # one build for 1, 2 or 4 row tiles
def _wide_linear_kernel(
    x_ptr, w_ptr, out_ptr, ws_ptr, counter_ptr, M, N, K, split_len, row_tiles,
    stride_xm, stride_wn, stride_om,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    tile = tl.program_id(0)  # row tiles fastest: a weight tile's readers run side by side
    m_tile, n_tile, split = tile % row_tiles, tile // row_tiles, tl.program_id(1)
    offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, n_mask = offs_m < M, offs_n < N
    k_lo = split * split_len
    k_hi = tl.minimum(k_lo + split_len, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x_at = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
        w_at = w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :]
        if EVEN_K:  # every chunk whole: the masks are constant along K
            x = tl.load(x_at, mask=m_mask[:, None], other=0.0)
            w = tl.load(w_at, mask=n_mask[:, None], other=0.0)
        else:
            k_mask = (offs_k < k_hi)[None, :]
            x = tl.load(x_at, mask=m_mask[:, None] & k_mask, other=0.0)
            w = tl.load(w_at, mask=n_mask[:, None] & k_mask, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    mask = m_mask[:, None] & n_mask[None, :]
    out_at = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    dt = out_ptr.dtype.element_ty
    if SPLIT_K == 1:
        tl.store(out_at, acc.to(dt), mask=mask)
    else:
        store_partial(ws_ptr, split, offs_m, offs_n, mask, acc, M, N)
        counter = counter_ptr + tile
        if arrive_last(counter, SPLIT_K):
            tl.store(out_at, sum_partials(ws_ptr, offs_m, offs_n, mask, M, N, SPLIT_K).to(dt),
                     mask=mask)  # fmt: skip
            reset_counter(counter)


def shared_bytes(tiles: tuple, elem: int = 2) -> int:
    """The pipeline's staged x and weight chunks of a launch at `tiles`."""
    block_m, block_n, block_k, _, stages = tiles
    return elem * stages * block_k * (block_m + block_n)


def wide_linear(
    x: torch.Tensor, weight: torch.Tensor, tiles: tuple, split_k: int = 1
) -> torch.Tensor:
    """F.linear(x, weight) for x [M, K] (unit column stride) and weight [N, K] contiguous, at
    `tiles` = (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) with the reduction cut into `split_k`
    ranges (at most one a BLOCK_K chunk). Returns a new [M, N] tensor in the weight's dtype."""
    rows, k = x.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and weight.is_contiguous() and x.stride(-1) == 1
    block_m, block_n, block_k, warps, stages = tiles
    out = torch.empty(rows, n, device=x.device, dtype=weight.dtype)
    row_tiles = host_cdiv(rows, block_m)
    output_tiles = row_tiles * host_cdiv(n, block_n)
    split_k = max(1, min(int(split_k), host_cdiv(k, block_k)))
    split_len = split_range(k, block_k, split_k)
    split_k = host_cdiv(k, split_len)  # the ranges that hold any of K
    _wide_linear_kernel[(output_tiles, split_k)](
        x, weight, out, split_workspace(split_k, rows, n, x.device),
        counters_for(x.device, output_tiles), rows, n, k, split_len, row_tiles,
        x.stride(0), weight.stride(0), out.stride(0),
        SPLIT_K=split_k, EVEN_K=k % block_k == 0,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out
