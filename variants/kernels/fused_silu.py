"""Fused SwiGLU activation: silu(gate) * up in one kernel (eager torch launches two, plus the
reads and writes of the intermediate). Rounds like the reference: silu in float32 cast to the
compute dtype, then the product in float32 cast once. Needs Triton >= 3.0; gate and up are row
views (the halves of a fused gate-up output, or two separate outputs)."""

import torch
import triton
import triton.language as tl

from variants.kernels.pdl import launch_options, wait_previous


@triton.jit
def _silu_mul_kernel(
    g_ptr, u_ptr, o_ptr, stride_g, stride_u, stride_o, cols, BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    wait_previous(PDL)  # gate and up come from the kernel before
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < cols
    g = tl.load(g_ptr + row * stride_g + offs, mask=mask, other=0.0)
    u = tl.load(u_ptr + row * stride_u + offs, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)
    out = (act.to(tl.float32) * u.to(tl.float32)).to(u.dtype)
    tl.store(o_ptr + row * stride_o + offs, out, mask=mask)


def silu_mul(gate: torch.Tensor, up: torch.Tensor, pdl: bool = False) -> torch.Tensor:
    """gate, up [N, I] with unit column stride -> silu(gate) * up as a new [N, I] tensor.
    `pdl`: launched with programmatic dependent launch (kernels/pdl.py)."""
    assert gate.shape == up.shape and gate.stride(-1) == 1 and up.stride(-1) == 1
    rows, cols = gate.shape
    out = torch.empty(rows, cols, device=gate.device, dtype=gate.dtype)
    block = min(1024, triton.next_power_of_2(cols))
    grid = (rows, triton.cdiv(cols, block))
    _silu_mul_kernel[grid](
        gate, up, out, gate.stride(0), up.stride(0), out.stride(0), cols, BLOCK=block,
        PDL=pdl, num_warps=4, **launch_options(pdl, gate.device),
    )  # fmt: skip
    return out
