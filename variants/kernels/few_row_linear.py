"""A linear layer for a few rows (a decode step), with the RMSNorm before it and the residual add
after it in the same kernel: out = residual + norm(x) @ W.T, each part optional.

cuBLAS's few-row GEMM costs about the same at any weight size (latency-bound), and the norm and
the add are launches of their own; here one launch does the three. Rounds like the reference:
the product is cast to the compute dtype, the residual add runs in float32 and is cast once, and
a float32 output (the logits) is the compute-dtype product widened. A long reduction over few
column tiles (the down projection) is split over K (split_k.py). Needs Triton >= 3.0."""

import torch
import triton
import triton.language as tl

from variants.kernels.pdl import launch_options, wait_previous
from variants.kernels.prefetch import prefetch_rows
from variants.kernels.row_dot import few_row_tiles, norm_chunks
from variants.kernels.split_k import (
    LONG_K,
    LONG_K_TILES,
    arrive_last,
    counters_for,
    host_cdiv,
    reset_counter,
    split_range,
    split_workspace,
    splits_for,
    store_partial,
    sum_partials,
    tile_counter,
)
from variants.kernels.staged_dot import (
    default_stage,
    project,
    short_staged_tiles,
    stage_chunks,
    stage_chunks_of,
)


@triton.jit
def _epilogue(acc, r, out_ptr, offs_m, offs_n, mask, stride_om, dt, RESIDUAL: tl.constexpr):
    y = acc.to(dt)
    if RESIDUAL:
        y = (r.to(tl.float32) + y.to(tl.float32)).to(dt)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :],
             y.to(out_ptr.dtype.element_ty), mask=mask)  # fmt: skip


@triton.jit
def linear_tile(
    m_tile, n_tile, split, counter, x_ptr, norm_ptr, w_ptr, res_ptr, out_ptr, ws_ptr, M, N, K,
    split_len, stride_xm, stride_wn, stride_rm, stride_om, eps,
    NORM_CHUNKS: tl.constexpr, RESIDUAL: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, w0, w1, w2, w3,
    STAGED: tl.constexpr,
):  # fmt: skip
    """Row tile m_tile's columns tile n_tile, reduction split `split` of SPLIT_K (`counter`:
    the tile's arrival counter when SPLIT_K > 1). STAGED > 0: the weight is already loaded,
    in STAGED chunks w0..w3 (`stage_chunks_of`)."""
    offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = n_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, n_mask = offs_m < M, offs_n < N
    mask = m_mask[:, None] & n_mask[None, :]
    r = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if RESIDUAL:  # issued first: its round trip overlaps the weight's
        r = tl.load(res_ptr + offs_m[:, None] * stride_rm + offs_n[None, :], mask=mask, other=0.0)
    k_lo = split * split_len
    k_hi = tl.minimum(k_lo + split_len, K)
    acc, _unused = project(
        x_ptr, stride_xm, offs_m, m_mask, norm_ptr, eps, w_ptr, stride_wn, offs_n, offs_n, n_mask,
        K, k_lo, k_hi, w0, w1, w2, w3, 0, 0, 0, 0, NORM_CHUNKS, SPLIT_K, False, STAGED, BLOCK_M,
        BLOCK_N, BLOCK_K,
    )  # fmt: skip
    dt = w_ptr.dtype.element_ty
    if SPLIT_K == 1:
        _epilogue(acc, r, out_ptr, offs_m, offs_n, mask, stride_om, dt, RESIDUAL)
    else:
        store_partial(ws_ptr, split, offs_m, offs_n, mask, acc, M, N)
        if arrive_last(counter, SPLIT_K):
            total = sum_partials(ws_ptr, offs_m, offs_n, mask, M, N, SPLIT_K)
            _epilogue(total, r, out_ptr, offs_m, offs_n, mask, stride_om, dt, RESIDUAL)
            reset_counter(counter)


@triton.jit
def _few_row_linear_kernel(
    x_ptr, norm_ptr, w_ptr, res_ptr, out_ptr, ws_ptr, counter_ptr, M, N, K, split_len,
    stride_xm, stride_wn, stride_rm, stride_om, eps,
    NORM_CHUNKS: tl.constexpr, RESIDUAL: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
    PREFETCH: tl.constexpr, LANES: tl.constexpr, STAGED: tl.constexpr,
):  # fmt: skip
    w0, w1, w2, w3 = 0, 0, 0, 0  # placeholders unless staged
    if STAGED > 0:  # this program's whole weight share, in registers before the wait
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        k_lo = tl.program_id(2) * split_len
        w0, w1, w2, w3 = stage_chunks_of(
            w_ptr, stride_wn, offs_n, offs_n < N, k_lo, tl.minimum(k_lo + split_len, K), STAGED,
            BLOCK_K,
        )  # fmt: skip
    elif PREFETCH:  # this column tile's weight rows, shared out over its row tiles and splits
        n0 = tl.program_id(0) * BLOCK_N
        prefetch_rows(
            w_ptr, n0, tl.minimum(BLOCK_N, N - n0), stride_wn,
            tl.program_id(1) * SPLIT_K + tl.program_id(2), tl.num_programs(1) * SPLIT_K, LANES,
        )  # fmt: skip
    wait_previous(PDL)
    linear_tile(
        tl.program_id(1), tl.program_id(0), tl.program_id(2), tile_counter(counter_ptr), x_ptr,
        norm_ptr, w_ptr, res_ptr, out_ptr, ws_ptr, M, N, K, split_len, stride_xm, stride_wn,
        stride_rm, stride_om, eps, NORM_CHUNKS, RESIDUAL, SPLIT_K, BLOCK_M, BLOCK_N, BLOCK_K,
        w0, w1, w2, w3, STAGED,
    )  # fmt: skip


def few_row_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    norm: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    sm_count: int = 132,
    tiles: tuple | None = None,
    split_k: int | None = None,
    pdl: bool = False,
    prefetch: bool = True,
    stage: bool | None = None,
) -> torch.Tensor:
    """x [M, K] (unit column stride); weight [N, K] contiguous; norm [K] applies
    rms_norm(x) * norm first; residual [M, N] is added last. Returns a new [M, N] tensor in
    out_dtype (default the weight's dtype). `tiles` = (BLOCK_N, BLOCK_K, warps, stages);
    `split_k` cuts the reduction into that many programs (default: `default_split_k`). `pdl`
    launches it with programmatic dependent launch (pdl.py), the weight prefetched into L2
    before the wait unless `prefetch` is False. `stage`: each program loads its whole weight
    share into registers instead, before the wait under PDL (staged_dot.py; `stage_chunks` says
    where it fits), a short reduction at `short_staged_tiles` unless `tiles` are given. None:
    `default_stage` (under PDL, one 16-row tile)."""
    rows, k = x.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and weight.is_contiguous() and x.stride(-1) == 1
    out = torch.empty(rows, n, device=x.device, dtype=out_dtype or weight.dtype)
    long_k = LONG_K_TILES if k >= LONG_K else None  # the tiles a split reduction runs best
    block_m, block_n, block_k, warps, stages = few_row_tiles(rows, n, sm_count, prefer=long_k)
    elem = weight.element_size()
    stage = default_stage(pdl, rows) if stage is None else stage
    if stage and tiles is None and long_k is None:  # a short reduction's staged tiles
        tiles = short_staged_tiles(block_m, k, elem)
    if tiles is not None:
        block_n, block_k, warps, stages = tiles
    if residual is not None:
        assert residual.shape == (rows, n) and residual.stride(-1) == 1
    grid = (host_cdiv(n, block_n), host_cdiv(rows, block_m))
    split_k = splits_for(split_k, grid[0] * grid[1], k, block_k, sm_count)
    split_len = split_range(k, block_k, split_k)
    staged = stage_chunks(block_m, block_n, block_k, warps, split_len, elem) if stage else 0
    _few_row_linear_kernel[grid + (split_k,)](
        x, norm if norm is not None else weight, weight,
        residual if residual is not None else out, out,
        split_workspace(split_k, rows, n, x.device), counters_for(x.device, grid[0] * grid[1]),
        rows, n, k, split_len,
        x.stride(0), weight.stride(0), residual.stride(0) if residual is not None else 0,
        out.stride(0), eps,
        NORM_CHUNKS=norm_chunks(k, block_k, norm is not None), RESIDUAL=residual is not None,
        SPLIT_K=split_k,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PDL=pdl, PREFETCH=pdl and prefetch,
        LANES=32 * warps, STAGED=staged, num_warps=warps, num_stages=stages,
        **launch_options(pdl, x.device),
    )  # fmt: skip
    return out
