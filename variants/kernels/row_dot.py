"""The shared inner part of our few-row projection kernels: rows of x (optionally RMS-normed on
the fly) times a tile of weight rows, float32 accumulation, one or two weight row sets at once.

At decode a projection has a handful of rows and a weight of megabytes, and each kernel is a
short chain of dependent memory round trips (each a full HBM latency): the kernels that
use this issue their epilogue's loads (residual, cos/sin, cache slots) before it. The norm's
statistics take a pass over x (a few rows, from L2) before the weight loop; the norm rounds
like the reference: float32 statistics, cast to the compute dtype, then the weight in the
compute dtype. Loading the whole reduction in one tile (one round trip) is slower than
256-wide chunks over 3 pipeline stages (experiments/bench_few_row.py)."""

import triton
import triton.language as tl

from variants.kernels.split_k import host_cdiv


@triton.jit
def rms_normed(x, norm_ptr, offs_k, k_mask, inv_rms, dt):
    """rms_norm(x) * norm weight over columns offs_k, rounded like the reference: the normed x
    cast to the compute dtype dt, then the weight applied in float32 and cast again."""
    normed = (x.to(tl.float32) * inv_rms[:, None]).to(dt)
    g = tl.load(norm_ptr + offs_k, mask=k_mask, other=0.0)
    return (normed.to(tl.float32) * g.to(tl.float32)[None, :]).to(dt)


@triton.jit
def norm_stats(x_ptr, stride_xm, offs_m, m_mask, K, eps, NORM_CHUNKS: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """1 / rms of each row of x over all of K (NORM_CHUNKS chunks of BLOCK_K), float32. Unrolled,
    squares summed per lane and reduced once: every chunk's load is in flight at once (one
    round trip, not one a chunk, and no block barrier between them)."""
    squares = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
    for c in tl.static_range(NORM_CHUNKS):
        offs_k = c * BLOCK_K + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=m_mask[:, None] & (offs_k < K)[None, :], other=0.0)  # fmt: skip
        xf = x.to(tl.float32)
        squares += xf * xf
    return tl.rsqrt(tl.sum(squares, axis=1) / K + eps)


@triton.jit
def rows_dot(
    x_ptr, stride_xm, offs_m, m_mask, norm_ptr, eps, w_ptr, stride_wn, rows_a, rows_b, w_mask, K,
    k_lo, k_hi, NORM_CHUNKS: tl.constexpr, PAIRED: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """(h @ W[rows_a].T, h @ W[rows_b].T) over columns k_lo..k_hi of K as float32 [BLOCK_M,
    BLOCK_N] each, where h is x (NORM_CHUNKS == 0) or rms_norm(x) * norm weight, its statistics
    over all of K = NORM_CHUNKS chunks of BLOCK_K (`norm_chunks`). Without PAIRED the second
    result is zeros and rows_b is unread."""
    dt = w_ptr.dtype.element_ty
    acc_a = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_b = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    inv_rms = tl.zeros([BLOCK_M], tl.float32)
    if NORM_CHUNKS > 0:  # a statistics pass first (x is a few rows, read from L2)
        inv_rms = norm_stats(x_ptr, stride_xm, offs_m, m_mask, K, eps, NORM_CHUNKS, BLOCK_M,
                             BLOCK_K)  # fmt: skip
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < k_hi
        wk_mask = w_mask[:, None] & k_mask[None, :]
        w_a = tl.load(w_ptr + rows_a[:, None] * stride_wn + offs_k[None, :], mask=wk_mask,
                      other=0.0)  # fmt: skip
        h = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=m_mask[:, None] & k_mask[None, :], other=0.0)  # fmt: skip
        if NORM_CHUNKS > 0:
            h = rms_normed(h, norm_ptr, offs_k, k_mask, inv_rms, dt)
        h = h.to(dt)
        acc_a = tl.dot(h, tl.trans(w_a), acc_a, input_precision="ieee")
        if PAIRED:
            w_b = tl.load(w_ptr + rows_b[:, None] * stride_wn + offs_k[None, :], mask=wk_mask,
                          other=0.0)  # fmt: skip
            acc_b = tl.dot(h, tl.trans(w_b), acc_b, input_precision="ieee")
    return acc_a, acc_b


def norm_chunks(k: int, block_k: int, norm: bool = True) -> int:
    """rows_dot's NORM_CHUNKS: the BLOCK_K chunks of the statistics pass over K, 0 for no norm."""
    return host_cdiv(k, block_k) if norm else 0


SHARED_MEMORY_BUDGET = 96 * 1024  # an RTX 3090 (sm_86) block gets 99 KiB; Hopper 227 KiB


def few_row_tiles(
    rows: int, cols: int, sm_count: int, weight_tiles: int = 1, prefer: tuple | None = None
) -> tuple:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages). 16-row tiles (tl.dot's minimum) up to 64
    rows; column tiles as wide as keeps a program per SM, from 16 to 64; 256-wide reduction
    chunks over 3 stages and 4 warps (the best at 1-64 rows for most shapes measured), or
    `prefer` = (BLOCK_N, BLOCK_K, warps, stages). Then fewer stages, then shorter chunks, until
    the staged tiles of x and of the `weight_tiles` weight tiles fit SHARED_MEMORY_BUDGET."""
    block_m = min(64, max(16, triton.next_power_of_2(rows)))
    block_n = 64
    while block_n > 16 and host_cdiv(cols, block_n) < sm_count:
        block_n //= 2
    block_k, warps, stages = 256, 4, 3
    if prefer is not None:
        block_n, block_k, warps, stages = prefer

    def staged_bytes() -> int:
        return 2 * stages * block_k * (block_m + weight_tiles * block_n)

    while staged_bytes() > SHARED_MEMORY_BUDGET and stages > 2:
        stages -= 1
    while staged_bytes() > SHARED_MEMORY_BUDGET and block_k > 32:
        block_k //= 2
    return block_m, block_n, block_k, warps, stages
