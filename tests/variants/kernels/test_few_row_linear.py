"""Few-row linear (norm prologue, residual epilogue) against torch's rms_norm + F.linear + add."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is not installed")

from variants.kernels.few_row_linear import few_row_linear  # noqa: E402
from variants.kernels.split_k import arrival_counters, split_range  # noqa: E402
from variants.kernels.staged_dot import stage_chunks  # noqa: E402
from variants.layers.rmsnorm import rms_norm  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(rows, n, k, dtype, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen).to(device, dtype)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(device, dtype)
    norm = (1 + 0.1 * torch.randn(k, generator=gen)).to(device, dtype)
    res = torch.randn(rows, n, generator=gen).to(device, dtype)
    return x, w, norm, res


@pytest.mark.parametrize("rows,n,k", [(1, 40, 24), (5, 96, 200), (19, 70, 64), (3, 256, 130)])
def test_plain_norm_and_residual_match_torch(rows, n, k):
    x, w, norm, res = _case(rows, n, k, torch.float32, DEVICE, seed=rows)
    tight = {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(few_row_linear(x, w, sm_count=4), F.linear(x, w), **tight)
    torch.testing.assert_close(
        few_row_linear(x, w, norm=norm, eps=1e-5, sm_count=4),
        F.linear(rms_norm(x, norm, 1e-5), w), **tight,
    )  # fmt: skip
    torch.testing.assert_close(
        few_row_linear(x, w, residual=res, sm_count=4), res + F.linear(x, w), **tight
    )


def test_strided_rows_and_float32_out():
    x, w, norm, _ = _case(6, 48, 32, torch.float32, DEVICE)
    wide = torch.randn(6, 80).to(DEVICE)
    wide[:, 8:40] = x  # a row-strided view, as slices of a wider buffer are
    got = few_row_linear(wide[:, 8:40], w, norm=norm, eps=1e-5, out_dtype=torch.float32)
    assert got.dtype == torch.float32 and got.shape == (6, 48)
    torch.testing.assert_close(got, F.linear(rms_norm(x, norm, 1e-5), w), atol=1e-5, rtol=1e-5)


def test_chunked_reduction_matches_the_one_shot():
    """K = 300 in one 512-wide tile, or in 64-wide chunks after a statistics pass."""
    x, w, norm, res = _case(4, 100, 300, torch.float32, DEVICE, seed=3)
    one_shot = few_row_linear(x, w, norm=norm, eps=1e-5, residual=res, sm_count=4)
    chunked = few_row_linear(x, w, norm=norm, eps=1e-5, residual=res, tiles=(32, 64, 4, 2))
    torch.testing.assert_close(chunked, one_shot, atol=1e-5, rtol=1e-5)
    want = res + F.linear(rms_norm(x, norm, 1e-5), w)
    torch.testing.assert_close(chunked, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("split_k", [2, 3, 5])
def test_split_reduction_matches_torch_and_leaves_the_counters_zero(split_k):
    """K = 300 in 64-wide chunks (5 of them) over 2, 3 or 5 programs a tile; the last to arrive
    adds the residual. Twice, bit for bit: the partials are summed in split order."""
    x, w, norm, res = _case(5, 100, 300, torch.float32, DEVICE, seed=split_k)
    run = lambda: few_row_linear(  # noqa: E731
        x, w, norm=norm, eps=1e-5, residual=res, tiles=(32, 64, 4, 2), split_k=split_k
    )
    got = run()
    want = res + F.linear(rms_norm(x, norm, 1e-5), w)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(run(), got)
    assert not arrival_counters(torch.device(DEVICE)).any()


def test_a_long_reduction_runs_its_own_tiles_split_by_default():
    """K = 2048 (LONG_K): 32 x 128 tiles, split by the default rule (4 programs a tile here)."""
    x, w, _, res = _case(3, 64, 2048, torch.float32, DEVICE, seed=7)
    got = few_row_linear(x, w, residual=res, sm_count=4)
    torch.testing.assert_close(got, res + F.linear(x, w), atol=1e-4, rtol=1e-5)
    assert not arrival_counters(torch.device(DEVICE)).any()


def test_more_splits_than_chunks_are_cut_to_the_chunks():
    x, w, _, _ = _case(2, 40, 64, torch.float32, DEVICE)
    got = few_row_linear(x, w, tiles=(16, 32, 4, 2), split_k=9)  # 2 chunks: 2 splits
    torch.testing.assert_close(got, F.linear(x, w), atol=1e-5, rtol=1e-5)
    assert not arrival_counters(torch.device(DEVICE)).any()


@pytest.mark.parametrize(
    "rows,k,tiles,split_k",
    [(5, 300, (16, 128, 8, 2), 1), (3, 700, (16, 256, 8, 2), 1), (4, 2048, (32, 128, 8, 2), 4),
     (4, 300, (16, 64, 8, 2), 2)],
)  # fmt: skip
def test_a_staged_weight_gives_the_looped_result_bit_for_bit(rows, k, tiles, split_k):
    """The weight share loaded at once (`stage=True`) against the pipelined loop, with the norm
    (its statistics from the staged x when one split covers K, else from a pass of their own)
    and the residual; float32, so a 16-row tile over 8 warps keeps the share in budget."""
    block_n, block_k, warps, _ = tiles
    chunks = stage_chunks(16, block_n, block_k, warps, split_range(k, block_k, split_k), elem=4)
    assert chunks > 0  # the case stages
    x, w, norm, res = _case(rows, 72, k, torch.float32, DEVICE, seed=k)
    for nm in (norm, None):
        kw = dict(norm=nm, eps=1e-5, residual=res, tiles=tiles, split_k=split_k)
        staged = few_row_linear(x, w, **kw, stage=True)
        assert torch.equal(staged, few_row_linear(x, w, **kw, stage=False))
        want = res + F.linear(rms_norm(x, nm, 1e-5) if nm is not None else x, w)
        torch.testing.assert_close(staged, want, atol=2e-5, rtol=1e-5)
    assert not arrival_counters(torch.device(DEVICE)).any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 8, 16])
@pytest.mark.parametrize(
    "n,k,tiles,split_k", [(768, 3072, None, None), (768, 768, (32, 128, 4, 3), 2),
                          (4096, 768, (32, 256, 8, 3), 1)],
)  # fmt: skip
def test_gpu_staged_half_matches_torch(rows, n, k, tiles, split_k):
    """The staged builds the decode step may run: the down projection (its own tiles), the
    output projection over two splits, the head (norm, float32 out)."""
    x, w, norm, res = _case(rows, n, k, torch.float16, "cuda", seed=rows)
    kw = dict(tiles=tiles, split_k=split_k, stage=True)
    want = res + F.linear(x, w)
    got = few_row_linear(x, w, residual=res, **kw)
    torch.testing.assert_close(got, want, atol=4e-3 * want.abs().max().item(), rtol=2e-3)
    assert torch.equal(got, few_row_linear(x, w, residual=res, **dict(kw, stage=False)))
    head = few_row_linear(x, w, norm=norm, eps=1e-5, out_dtype=torch.float32, **kw)
    want_head = F.linear(rms_norm(x, norm, 1e-5), w).float()
    torch.testing.assert_close(head, want_head, atol=4e-3 * want_head.abs().max().item(), rtol=2e-3)
    assert not arrival_counters(x.device).any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 8, 64])
@pytest.mark.parametrize("n,k", [(768, 768), (768, 3072), (4096, 768)])
@pytest.mark.parametrize("split_k", [None, 1, 3])
def test_gpu_half_matches_torch(rows, n, k, split_k):
    x, w, norm, res = _case(rows, n, k, torch.float16, "cuda", seed=rows)
    want = res + F.linear(rms_norm(x, norm, 1e-5), w)
    got = few_row_linear(x, w, norm=norm, eps=1e-5, residual=res, split_k=split_k)
    # the same products in another summation order: one or two units of the output's rounding
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, atol=4e-3 * scale, rtol=2e-3)
    head = few_row_linear(x, w, norm=norm, eps=1e-5, out_dtype=torch.float32, split_k=split_k)
    want_head = F.linear(rms_norm(x, norm, 1e-5), w).float()
    torch.testing.assert_close(head, want_head, atol=4e-3 * want_head.abs().max().item(), rtol=2e-3)
    assert not arrival_counters(x.device).any()
