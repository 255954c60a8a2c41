"""RMSNorm in the reference's cast order: float32 statistics, cast back, then the weight.

Any other order (weight in float32, cast last) drifts from the reference by fp16 rounding."""

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight
