"""Fused residual add + RMSNorm against the engine's own torch rms_norm."""

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from variants.kernels.fused_norm import add_rms_norm  # noqa: E402
from variants.layers.rmsnorm import rms_norm  # noqa: E402

# The small float32 cases run on the GPU where there is one (Triton needs device tensors there).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(rows, hidden, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=gen).to(device, dtype)
    delta = torch.randn(rows, hidden, generator=gen).to(device, dtype)
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(device, dtype)
    return x, delta, weight


@pytest.mark.parametrize("hidden", [48, 64, 100])
def test_add_rms_norm_matches_torch(hidden):
    x, delta, weight = _case(5, hidden, torch.float32, DEVICE)
    new_x, normed = add_rms_norm(x, delta, weight, 1e-5)
    torch.testing.assert_close(new_x, x + delta, atol=0, rtol=0)
    torch.testing.assert_close(normed, rms_norm(x + delta, weight, 1e-5), atol=1e-5, rtol=1e-5)


def test_without_delta_returns_x_and_its_norm():
    x, _, weight = _case(3, 40, torch.float32, DEVICE, seed=1)
    new_x, normed = add_rms_norm(x, None, weight, 1e-6)
    assert new_x is x
    torch.testing.assert_close(normed, rms_norm(x, weight, 1e-6), atol=1e-5, rtol=1e-5)


def test_strided_rows():
    x, delta, weight = _case(4, 64, torch.float32, DEVICE, seed=2)
    wide = torch.cat([x, delta], dim=1)  # views with row stride 128
    new_x, normed = add_rms_norm(wide[:, :64], wide[:, 64:], weight, 1e-5)
    torch.testing.assert_close(normed, rms_norm(x + delta, weight, 1e-5), atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 8, 512])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_add_rms_norm(rows, dtype):
    x, delta, weight = _case(rows, 768, dtype, "cuda")
    new_x, normed = add_rms_norm(x, delta, weight, 1e-5)
    torch.testing.assert_close(new_x, x + delta, atol=0, rtol=0)  # the same rounding
    ref = rms_norm(x + delta, weight, 1e-5)
    # float32 sums in another order can move an element by one unit in the last place
    torch.testing.assert_close(normed, ref, atol=1e-2, rtol=1e-2)
    assert (normed != ref).float().mean().item() < 0.01
