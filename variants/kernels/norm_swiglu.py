"""The first half of the MLP for a few rows in one kernel: silu(norm(x) @ Wg.T) * (norm(x) @ Wu.T)
from the fused gate-up weight, each program reading matching gate and up rows.

Replaces the RMSNorm launch, the gate-up GEMM and the SiLU-mul launch of a decode step, and the
[M, 2I] intermediate. Rounds like the reference: gate and up cast to the compute dtype, silu in
float32 cast back, the product in float32 cast once. Needs Triton >= 3.0."""

import torch
import triton
import triton.language as tl

from variants.kernels.row_dot import few_row_tiles, rows_dot


@triton.jit
def _norm_swiglu_kernel(
    x_ptr, norm_ptr, w_ptr, out_ptr, M, INTER, K, stride_xm, stride_wn, stride_om, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_j = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, j_mask = offs_m < M, offs_j < INTER
    gate, up = rows_dot(
        x_ptr, stride_xm, offs_m, m_mask, norm_ptr, eps, w_ptr, stride_wn, offs_j,
        INTER + offs_j, j_mask, K, True, True, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    dt = w_ptr.dtype.element_ty
    g = gate.to(dt).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(dt)
    y = (act.to(tl.float32) * up.to(dt).to(tl.float32)).to(dt)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_j[None, :], y,
             mask=m_mask[:, None] & j_mask[None, :])  # fmt: skip


def norm_swiglu(
    x: torch.Tensor,
    norm: torch.Tensor,
    gate_up: torch.Tensor,
    eps: float,
    sm_count: int = 132,
    tiles: tuple | None = None,
) -> torch.Tensor:
    """x [M, K]; norm [K]; gate_up [2I, K] (gate rows, then up rows). Returns [M, I]
    = silu(gate) * up of rms_norm(x) * norm. `tiles` = (BLOCK_N, BLOCK_K, warps, stages)."""
    rows, k = x.shape
    inter = gate_up.shape[0] // 2
    assert gate_up.shape == (2 * inter, k) and gate_up.is_contiguous() and x.stride(-1) == 1
    out = torch.empty(rows, inter, device=x.device, dtype=gate_up.dtype)
    # the best of the tile list for this kernel on the H200 at 1-8 rows (docs/PERF.md, run 9)
    block_m, block_n, block_k, warps, stages = few_row_tiles(
        rows, inter, sm_count, weight_tiles=2, prefer=(32, 64, 4, 4)
    )
    if tiles is not None:
        block_n, block_k, warps, stages = tiles
    grid = (triton.cdiv(inter, block_n), triton.cdiv(rows, block_m))
    _norm_swiglu_kernel[grid](
        x, norm, gate_up, out, rows, inter, k, x.stride(0), gate_up.stride(0), out.stride(0), eps,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out
