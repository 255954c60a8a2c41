"""Norm + gate-up + SiLU-mul in one kernel against rms_norm, the fused gate-up F.linear and
F.silu(gate) * up."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is not installed")

from variants.kernels.norm_swiglu import norm_swiglu, swiglu_tiles  # noqa: E402
from variants.kernels.split_k import arrival_counters, split_range  # noqa: E402
from variants.kernels.staged_dot import stage_chunks  # noqa: E402
from variants.layers.rmsnorm import rms_norm  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(rows, inter, k, dtype, device, seed=0, tiles=None, split_k=None, stage=None):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen).to(device, dtype)
    gate_up = (torch.randn(2 * inter, k, generator=gen) / k**0.5).to(device, dtype)
    norm = (1 + 0.1 * torch.randn(k, generator=gen)).to(device, dtype)
    gate, up = F.linear(rms_norm(x, norm, 1e-5), gate_up).chunk(2, dim=-1)
    got = norm_swiglu(x, norm, gate_up, 1e-5, sm_count=4, tiles=tiles, split_k=split_k,
                      stage=stage)  # fmt: skip
    return got, F.silu(gate) * up


@pytest.mark.parametrize("rows,inter,k", [(1, 96, 64), (7, 40, 24), (18, 130, 100)])
def test_matches_torch(rows, inter, k):
    got, want = _case(rows, inter, k, torch.float32, DEVICE, seed=rows)
    assert got.shape == (rows, inter)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_two_row_tiles_take_half_as_wide_column_tiles():
    """Measured on the H200 (experiments/bench_few_row.py): 32 columns a program over six
    stages up to 16 rows, 16 columns over four past them."""
    assert [swiglu_tiles(rows) for rows in (1, 16, 17, 32)] == [(32, 64, 4, 6)] * 2 + [
        (16, 64, 4, 4)
    ] * 2


def test_chunked_reduction_matches_torch():
    got, want = _case(6, 50, 200, torch.float32, DEVICE, tiles=(16, 64, 4, 2))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("split_k", [2, 4])
def test_split_reduction_matches_torch_and_leaves_the_counters_zero(split_k):
    """K = 200 in 64-wide chunks (4) over 2 or 4 programs a tile, gate and up partials each."""
    got, want = _case(6, 50, 200, torch.float32, DEVICE, tiles=(16, 64, 4, 2), split_k=split_k)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not arrival_counters(torch.device(DEVICE)).any()


@pytest.mark.parametrize(
    "k,tiles,split_k",
    [(200, (16, 64, 8, 2), 1), (200, (16, 64, 8, 2), 2), (300, (16, 128, 8, 2), 2)],
)
def test_staged_gate_and_up_give_the_looped_result_bit_for_bit(k, tiles, split_k):
    """Both weight tiles loaded at once before the (here absent) wait, the norm's statistics
    from the staged x in one split or from a pass of their own in two."""
    block_n, block_k, warps, _ = tiles
    split_len = split_range(k, block_k, split_k)
    assert stage_chunks(16, block_n, block_k, warps, split_len, elem=4, weight_tiles=2) > 0
    staged, want = _case(6, 50, k, torch.float32, DEVICE, seed=k, tiles=tiles, split_k=split_k,
                         stage=True)  # fmt: skip
    looped, _ = _case(6, 50, k, torch.float32, DEVICE, seed=k, tiles=tiles, split_k=split_k,
                      stage=False)  # fmt: skip
    assert torch.equal(staged, looped)
    torch.testing.assert_close(staged, want, atol=1e-5, rtol=1e-5)
    assert not arrival_counters(torch.device(DEVICE)).any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 8, 16])
@pytest.mark.parametrize("tiles,split_k", [((32, 128, 8, 3), 2), ((16, 128, 4, 3), 2)])
def test_gpu_staged_half_matches_torch(rows, tiles, split_k):
    got, want = _case(rows, 3072, 768, torch.float16, "cuda", seed=rows, tiles=tiles,
                      split_k=split_k, stage=True)  # fmt: skip
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, atol=4e-3 * scale, rtol=2e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 8, 32, 64])
@pytest.mark.parametrize("split_k", [None, 1, 3])
def test_gpu_half_matches_torch(rows, split_k):
    got, want = _case(rows, 3072, 768, torch.float16, "cuda", seed=rows, split_k=split_k)
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, atol=4e-3 * scale, rtol=2e-3)
