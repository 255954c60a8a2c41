"""Fused residual add + RMSNorm: one read of x and delta, one write of each output.

Wins in decode, where each of eager torch's ~6 elementwise launches per norm costs more than the
math; rounds like the reference (add in the compute dtype, float32 statistics, cast, then the
weight in the compute dtype). Needs Triton >= 3.0; one program per row, BLOCK = next pow2 of H."""

import torch
import triton
import triton.language as tl

from variants.kernels.pdl import launch_options, wait_previous


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, delta_ptr, w_ptr, new_x_ptr, normed_ptr,
    stride_x, stride_d, stride_nx, stride_o, hidden, eps,
    HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_previous(PDL)  # x and delta come from the kernels before
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_DELTA:
        delta = tl.load(delta_ptr + row * stride_d + offs, mask=mask, other=0.0)
        # torch adds half tensors in float32 and rounds once: the same here.
        x = (x.to(tl.float32) + delta.to(tl.float32)).to(x.dtype)
        tl.store(new_x_ptr + row * stride_nx + offs, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, axis=0) / hidden + eps)
    normed = (xf * inv_rms).to(x.dtype)  # cast back first, then the weight in the compute dtype
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    out = (normed.to(tl.float32) * w.to(tl.float32)).to(normed_ptr.dtype.element_ty)
    tl.store(normed_ptr + row * stride_o + offs, out, mask=mask)


def add_rms_norm(
    x: torch.Tensor,
    delta: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    pdl: bool = False,
) -> tuple:
    """x, delta [N, H] (rows may be strided); weight [H]. Returns (x + delta, rms_norm of it);
    without delta, (x, rms_norm(x)). `pdl`: launched with programmatic dependent launch
    (kernels/pdl.py), so its programs start while the kernel before finishes."""
    rows, hidden = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    if delta is not None and delta.stride(-1) != 1:
        delta = delta.contiguous()
    weight = weight.contiguous()
    normed = torch.empty(rows, hidden, device=x.device, dtype=x.dtype)
    new_x = torch.empty_like(normed) if delta is not None else x
    block = triton.next_power_of_2(hidden)
    _add_rms_norm_kernel[(rows,)](
        x, delta if delta is not None else x, weight, new_x, normed,
        x.stride(0), delta.stride(0) if delta is not None else 0, new_x.stride(0),
        normed.stride(0), hidden, eps,
        HAS_DELTA=delta is not None, BLOCK=block, PDL=pdl,
        num_warps=min(16, max(1, block // 256)), **launch_options(pdl, x.device),
    )  # fmt: skip
    return new_x, normed
