"""A few-row projection's weight share loaded before its PDL wait: each program asks for its
whole slice of the weight (up to four BLOCK_K chunks) into registers while the kernel before it
still runs, so after the wait only x's round trip and the products remain.

The pipelined loop of `row_dot.rows_dot` issues its first weight chunks only after the wait
(the loop reads x, an earlier kernel's output, beside them); the L2 prefetch before the wait
(prefetch.py) leaves an L2 round trip a chunk. Staging removes it where the registers allow:
`stage_chunks` is the rule, from the bytes a thread holds of weight and of x. The products are
summed chunk by chunk in order, as `rows_dot` sums them; the norm's statistics come from the
same registers as the products' x. Weights are never written by an earlier kernel, so reading
them before the wait is safe (pdl.py)."""

import triton
import triton.language as tl

from variants.kernels.row_dot import norm_stats, rms_normed, rows_dot
from variants.kernels.split_k import host_cdiv


@triton.jit
def _chunk(ptr, rows, stride, r_mask, k0, k_hi, BLOCK_K: tl.constexpr):
    """Columns k0..k0+BLOCK_K (masked from k_hi) of rows `rows` at ptr (zeros where masked)."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    return tl.load(ptr + rows[:, None] * stride + offs_k[None, :],
                   mask=r_mask[:, None] & (offs_k < k_hi)[None, :], other=0.0)  # fmt: skip


@triton.jit
def stage_chunks_of(ptr, stride, rows, r_mask, k_lo, k_hi, CHUNKS: tl.constexpr,
                    BLOCK_K: tl.constexpr):  # fmt: skip
    """Rows `rows` over k_lo..k_hi as CHUNKS (1-4) BLOCK_K chunks, all asked for at once.
    Unused chunks repeat the first (never read)."""
    c0 = _chunk(ptr, rows, stride, r_mask, k_lo, k_hi, BLOCK_K)
    c1 = c0
    c2 = c0
    c3 = c0
    if CHUNKS > 1:
        c1 = _chunk(ptr, rows, stride, r_mask, k_lo + BLOCK_K, k_hi, BLOCK_K)
    if CHUNKS > 2:
        c2 = _chunk(ptr, rows, stride, r_mask, k_lo + 2 * BLOCK_K, k_hi, BLOCK_K)
    if CHUNKS > 3:
        c3 = _chunk(ptr, rows, stride, r_mask, k_lo + 3 * BLOCK_K, k_hi, BLOCK_K)
    return c0, c1, c2, c3


@triton.jit
def _normed_chunk(x, norm_ptr, k0, k_hi, inv_rms, NORM: tl.constexpr, BLOCK_K: tl.constexpr,
                  dt):  # fmt: skip
    """A chunk of h in the compute dtype dt: x, or `rms_normed` x."""
    if NORM:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = rms_normed(x, norm_ptr, offs_k, offs_k < k_hi, inv_rms, dt)
    return x.to(dt)


@triton.jit
def staged_inputs(
    x_ptr, stride_xm, offs_m, m_mask, norm_ptr, eps, K, k_lo, k_hi, dt,
    NORM_CHUNKS: tl.constexpr, SPLIT_K: tl.constexpr, CHUNKS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """h over k_lo..k_hi as CHUNKS chunks [BLOCK_M, BLOCK_K] in the compute dtype dt: x's
    chunks in one round trip, then (NORM_CHUNKS > 0) rms_norm(x) * norm weight. Its statistics
    come from the same registers when one split covers K (squares summed per lane chunk by
    chunk, then reduced), else from a pass over all of K issued beside them (`norm_stats`)."""
    x0, x1, x2, x3 = stage_chunks_of(x_ptr, stride_xm, offs_m, m_mask, k_lo, k_hi, CHUNKS,
                                     BLOCK_K)  # fmt: skip
    inv_rms = tl.zeros([BLOCK_M], tl.float32)
    if NORM_CHUNKS > 0 and SPLIT_K > 1:
        inv_rms = norm_stats(x_ptr, stride_xm, offs_m, m_mask, K, eps, NORM_CHUNKS, BLOCK_M,
                             BLOCK_K)  # fmt: skip
    if NORM_CHUNKS > 0 and SPLIT_K == 1:
        squares = x0.to(tl.float32) * x0.to(tl.float32)
        if CHUNKS > 1:
            squares += x1.to(tl.float32) * x1.to(tl.float32)
        if CHUNKS > 2:
            squares += x2.to(tl.float32) * x2.to(tl.float32)
        if CHUNKS > 3:
            squares += x3.to(tl.float32) * x3.to(tl.float32)
        inv_rms = tl.rsqrt(tl.sum(squares, axis=1) / K + eps)
    norm: tl.constexpr = NORM_CHUNKS > 0
    h0 = _normed_chunk(x0, norm_ptr, k_lo, k_hi, inv_rms, norm, BLOCK_K, dt)
    h1 = h0
    h2 = h0
    h3 = h0
    if CHUNKS > 1:
        h1 = _normed_chunk(x1, norm_ptr, k_lo + BLOCK_K, k_hi, inv_rms, norm, BLOCK_K, dt)
    if CHUNKS > 2:
        h2 = _normed_chunk(x2, norm_ptr, k_lo + 2 * BLOCK_K, k_hi, inv_rms, norm, BLOCK_K, dt)
    if CHUNKS > 3:
        h3 = _normed_chunk(x3, norm_ptr, k_lo + 3 * BLOCK_K, k_hi, inv_rms, norm, BLOCK_K, dt)
    return h0, h1, h2, h3


@triton.jit
def staged_dot(h0, h1, h2, h3, w0, w1, w2, w3, CHUNKS: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr):  # fmt: skip
    """The float32 [BLOCK_M, BLOCK_N] sum over the chunks, in order, of h_c @ w_c.T."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc = tl.dot(h0, tl.trans(w0), acc, input_precision="ieee")
    if CHUNKS > 1:
        acc = tl.dot(h1, tl.trans(w1), acc, input_precision="ieee")
    if CHUNKS > 2:
        acc = tl.dot(h2, tl.trans(w2), acc, input_precision="ieee")
    if CHUNKS > 3:
        acc = tl.dot(h3, tl.trans(w3), acc, input_precision="ieee")
    return acc


@triton.jit
def project(
    x_ptr, stride_xm, offs_m, m_mask, norm_ptr, eps, w_ptr, stride_wn, rows_a, rows_b, w_mask,
    K, k_lo, k_hi, a0, a1, a2, a3, b0, b1, b2, b3, NORM_CHUNKS: tl.constexpr,
    SPLIT_K: tl.constexpr, PAIRED: tl.constexpr, STAGED: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """`row_dot.rows_dot`'s (h @ W[rows_a].T, h @ W[rows_b].T), from the staged chunks a0..a3
    (and b0..b3 when PAIRED) when STAGED > 0, else through its pipelined loop."""
    if STAGED > 0:
        h0, h1, h2, h3 = staged_inputs(
            x_ptr, stride_xm, offs_m, m_mask, norm_ptr, eps, K, k_lo, k_hi,
            w_ptr.dtype.element_ty, NORM_CHUNKS, SPLIT_K, STAGED, BLOCK_M, BLOCK_K,
        )  # fmt: skip
        acc_a = staged_dot(h0, h1, h2, h3, a0, a1, a2, a3, STAGED, BLOCK_M, BLOCK_N)
        acc_b = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        if PAIRED:
            acc_b = staged_dot(h0, h1, h2, h3, b0, b1, b2, b3, STAGED, BLOCK_M, BLOCK_N)
    else:
        acc_a, acc_b = rows_dot(
            x_ptr, stride_xm, offs_m, m_mask, norm_ptr, eps, w_ptr, stride_wn, rows_a, rows_b,
            w_mask, K, k_lo, k_hi, NORM_CHUNKS, PAIRED, BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip
    return acc_a, acc_b


STAGE_BYTES = 384  # the most bytes a thread holds of staged weight (96 registers), and of x
# Where staging wins in whole decode steps (experiments/step_kernels.py, `@on` / `@off`):
# the few-row projections of one 16-row tile (from 17 rows the 32-row x costs more than the
# staging saves, the most for the output projection and the head); the output projection
# and the head at 32 x 256 tiles over 8 warps (at their own
# 16 x 256 over 4 warps the staged build takes 254 registers and loses); not the QKV and
# gate-up pairs at any tile tried.
STAGE_MAX_ROWS = 16
STAGED_TILES = (32, 256, 8, 3)  # (BLOCK_N, BLOCK_K, warps, stages)


def stage_chunks(block_m: int, block_n: int, block_k: int, warps: int, split_len: int,
                 elem: int, weight_tiles: int = 1) -> int:  # fmt: skip
    """How many BLOCK_K chunks a program stages before its PDL wait, or 0 when its share does
    not fit: at most four chunks, its weight (`weight_tiles` tiles of BLOCK_N rows) and its x
    (`elem` bytes an element) within STAGE_BYTES a thread each."""
    chunks = host_cdiv(split_len, block_k)
    threads = 32 * warps
    w_bytes = elem * weight_tiles * block_n * chunks * block_k // threads
    x_bytes = elem * block_m * chunks * block_k // threads
    fits = chunks <= 4 and w_bytes <= STAGE_BYTES and x_bytes <= STAGE_BYTES
    return chunks if fits else 0


def default_stage(pdl: bool, rows: int) -> bool:
    """Whether a few-row projection stages its weight when not told: under PDL (there is no
    wait to hide the loads behind otherwise), up to STAGE_MAX_ROWS rows."""
    return pdl and rows <= STAGE_MAX_ROWS


def short_staged_tiles(block_m: int, k: int, elem: int) -> tuple | None:
    """STAGED_TILES for a short reduction (one split of all of K) where its share staged at them
    fits `stage_chunks`, else None (the launcher's own tiles then)."""
    block_n, block_k, warps, _ = STAGED_TILES
    fits = stage_chunks(block_m, block_n, block_k, warps, host_cdiv(k, block_k) * block_k, elem)
    return STAGED_TILES if fits else None
