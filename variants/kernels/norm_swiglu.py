"""The first half of the MLP for a few rows in one kernel: silu(norm(x) @ Wg.T) * (norm(x) @ Wu.T)
from the fused gate-up weight, each program reading matching gate and up rows.

Replaces the RMSNorm launch, the gate-up GEMM and the SiLU-mul launch of a decode step, and the
[M, 2I] intermediate. Rounds like the reference: gate and up cast to the compute dtype, silu in
float32 cast back, the product in float32 cast once. Needs Triton >= 3.0."""

import torch
import triton
import triton.language as tl

from variants.kernels.pdl import launch_options, wait_previous
from variants.kernels.prefetch import prefetch_rows
from variants.kernels.row_dot import few_row_tiles, norm_chunks
from variants.kernels.split_k import (
    counters_for,
    host_cdiv,
    pair_partials,
    reset_counter,
    split_range,
    split_workspace,
    splits_for,
    tile_counter,
)
from variants.kernels.staged_dot import project, stage_chunks, stage_chunks_of


@triton.jit
def _swiglu_store(gate, up, out_ptr, offs_m, offs_j, mask, stride_om, dt):
    g = gate.to(dt).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(dt)
    y = (act.to(tl.float32) * up.to(dt).to(tl.float32)).to(dt)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_j[None, :], y, mask=mask)


@triton.jit
def swiglu_tile(
    m_tile, j_tile, split, counter, x_ptr, norm_ptr, w_ptr, out_ptr, ws_ptr, M, INTER, K,
    split_len, stride_xm, stride_wn, stride_om, eps,
    NORM_CHUNKS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, g0, g1, g2, g3, u0, u1, u2, u3,
    STAGED: tl.constexpr,
):  # fmt: skip
    """Row tile m_tile's columns tile j_tile, reduction split `split` of SPLIT_K (`counter`:
    the tile's arrival counter when SPLIT_K > 1). STAGED > 0: the gate and up rows are already
    loaded, in STAGED chunks g0..g3 and u0..u3 (`stage_chunks_of`)."""
    offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_j = j_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, j_mask = offs_m < M, offs_j < INTER
    mask = m_mask[:, None] & j_mask[None, :]
    k_lo = split * split_len
    k_hi = tl.minimum(k_lo + split_len, K)
    gate, up = project(
        x_ptr, stride_xm, offs_m, m_mask, norm_ptr, eps, w_ptr, stride_wn, offs_j, INTER + offs_j,
        j_mask, K, k_lo, k_hi, g0, g1, g2, g3, u0, u1, u2, u3, NORM_CHUNKS, SPLIT_K, True, STAGED,
        BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    dt = w_ptr.dtype.element_ty
    if SPLIT_K == 1:
        _swiglu_store(gate, up, out_ptr, offs_m, offs_j, mask, stride_om, dt)
    else:
        last, gate, up = pair_partials(
            ws_ptr, split, counter, offs_m, offs_j, mask, gate, up, M, INTER, SPLIT_K
        )
        if last:
            _swiglu_store(gate, up, out_ptr, offs_m, offs_j, mask, stride_om, dt)
            reset_counter(counter)


@triton.jit
def _norm_swiglu_kernel(
    x_ptr, norm_ptr, w_ptr, out_ptr, ws_ptr, counter_ptr, M, INTER, K, split_len,
    stride_xm, stride_wn, stride_om, eps,
    NORM_CHUNKS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr,
    LANES: tl.constexpr, STAGED: tl.constexpr,
):  # fmt: skip
    g0, g1, g2, g3 = 0, 0, 0, 0  # placeholders unless staged
    u0, u1, u2, u3 = 0, 0, 0, 0
    if STAGED > 0:  # this program's gate and up rows, in registers before the wait
        offs_j = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        k_lo = tl.program_id(2) * split_len
        k_hi = tl.minimum(k_lo + split_len, K)
        j_mask = offs_j < INTER
        g0, g1, g2, g3 = stage_chunks_of(w_ptr, stride_wn, offs_j, j_mask, k_lo, k_hi, STAGED,
                                         BLOCK_K)  # fmt: skip
        u0, u1, u2, u3 = stage_chunks_of(w_ptr, stride_wn, INTER + offs_j, j_mask, k_lo, k_hi,
                                         STAGED, BLOCK_K)  # fmt: skip
    elif PREFETCH:  # this tile's gate rows and up rows, shared out over its row tiles and splits
        j0 = tl.program_id(0) * BLOCK_N
        rows = tl.minimum(BLOCK_N, INTER - j0)
        part = tl.program_id(1) * SPLIT_K + tl.program_id(2)
        parts = tl.num_programs(1) * SPLIT_K
        prefetch_rows(w_ptr, j0, rows, stride_wn, part, parts, LANES)
        prefetch_rows(w_ptr, INTER + j0, rows, stride_wn, part, parts, LANES)
    wait_previous(PDL)
    swiglu_tile(
        tl.program_id(1), tl.program_id(0), tl.program_id(2), tile_counter(counter_ptr), x_ptr,
        norm_ptr, w_ptr, out_ptr, ws_ptr, M, INTER, K, split_len, stride_xm, stride_wn,
        stride_om, eps, NORM_CHUNKS, SPLIT_K, BLOCK_M, BLOCK_N, BLOCK_K, g0, g1, g2, g3, u0, u1,
        u2, u3, STAGED,
    )  # fmt: skip


def swiglu_tiles(rows: int) -> tuple:
    """(BLOCK_N, BLOCK_K, warps, stages) of norm_swiglu at `rows` rows, from whole decode
    steps with PDL (experiments/step_kernels.py): 32-column tiles up to one 16-row tile (16
    columns lose there); 16-column tiles, twice the programs, at two 16-row tiles. Six stages
    at one row tile: five of the 12 chunks in flight, not three; at two row tiles more stages
    lose (fewer programs an SM)."""
    return (32, 64, 4, 6) if rows <= 16 else (16, 64, 4, 4)


def norm_swiglu(
    x: torch.Tensor,
    norm: torch.Tensor,
    gate_up: torch.Tensor,
    eps: float,
    sm_count: int = 132,
    tiles: tuple | None = None,
    split_k: int | None = None,
    pdl: bool = False,
    prefetch: bool = True,
    stage: bool = False,
) -> torch.Tensor:
    """x [M, K]; norm [K]; gate_up [2I, K] (gate rows, then up rows). Returns [M, I]
    = silu(gate) * up of rms_norm(x) * norm. `tiles` = (BLOCK_N, BLOCK_K, warps, stages);
    `split_k` cuts the reduction into that many programs (default: `default_split_k`); `pdl`,
    `prefetch` and `stage` as in `few_row_linear`, but `stage` is off unless asked: staged
    pairs of tiles lose (staged_dot.py: where staging wins)."""
    rows, k = x.shape
    inter = gate_up.shape[0] // 2
    assert gate_up.shape == (2 * inter, k) and gate_up.is_contiguous() and x.stride(-1) == 1
    out = torch.empty(rows, inter, device=x.device, dtype=gate_up.dtype)
    block_m, block_n, block_k, warps, stages = few_row_tiles(
        rows, inter, sm_count, weight_tiles=2, prefer=swiglu_tiles(rows)
    )
    if tiles is not None:
        block_n, block_k, warps, stages = tiles
    grid = (host_cdiv(inter, block_n), host_cdiv(rows, block_m))
    split_k = splits_for(split_k, grid[0] * grid[1], k, block_k, sm_count)
    split_len = split_range(k, block_k, split_k)
    staged = 0
    if stage:
        staged = stage_chunks(block_m, block_n, block_k, warps, split_len,
                              gate_up.element_size(), weight_tiles=2)  # fmt: skip
    _norm_swiglu_kernel[grid + (split_k,)](
        x, norm, gate_up, out, split_workspace(split_k, rows, inter, x.device, pairs=2),
        counters_for(x.device, grid[0] * grid[1]), rows, inter, k,
        split_len, x.stride(0), gate_up.stride(0), out.stride(0), eps,
        NORM_CHUNKS=norm_chunks(k, block_k), SPLIT_K=split_k, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k, PDL=pdl, PREFETCH=pdl and prefetch, LANES=32 * warps, STAGED=staged,
        num_warps=warps, num_stages=stages, **launch_options(pdl, x.device),
    )  # fmt: skip
    return out
