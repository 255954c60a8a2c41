"""Fused silu(gate) * up against torch's two-op SwiGLU, on halves of a fused output."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is not installed")

from variants.kernels.fused_silu import silu_mul  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("rows,cols", [(1, 40), (5, 96), (3, 1500)])
def test_matches_torch_on_fused_halves(rows, cols):
    gen = torch.Generator().manual_seed(rows)
    fused = (3 * torch.randn(rows, 2 * cols, generator=gen)).to(DEVICE)
    gate, up = fused.chunk(2, dim=-1)  # strided row views, as the fused projection gives
    got = silu_mul(gate, up)
    assert got.shape == (rows, cols) and got.is_contiguous()
    torch.testing.assert_close(got, F.silu(gate) * up, atol=1e-6, rtol=1e-5)


def test_separate_tensors():
    gen = torch.Generator().manual_seed(9)
    gate, up = torch.randn(4, 64, generator=gen), torch.randn(4, 64, generator=gen)
    torch.testing.assert_close(
        silu_mul(gate.to(DEVICE), up.to(DEVICE)).cpu(), F.silu(gate) * up, atol=1e-6, rtol=1e-5
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_half_rounds_like_torch(dtype):
    gen = torch.Generator().manual_seed(0)
    fused = (4 * torch.randn(512, 6144, generator=gen)).to("cuda", dtype)
    gate, up = fused.chunk(2, dim=-1)
    want = F.silu(gate) * up
    got = silu_mul(gate, up)
    # one unit in the last place at most: exp differs in its last bits between libraries
    ulp = want.abs().float() * (2.0**-10 if dtype == torch.float16 else 2.0**-7)
    assert ((got.float() - want.float()).abs() <= ulp + 1e-6).float().mean().item() > 0.999
    assert (got.float() - want.float()).abs().max().item() <= 2 * ulp.max().item()
