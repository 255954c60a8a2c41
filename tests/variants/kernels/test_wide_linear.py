"""The prefill projection kernel against F.linear, at every split and at row and column counts
that leave partial tiles."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is not installed")

from variants.kernels.split_k import arrival_counters  # noqa: E402
from variants.kernels.wide_linear import (  # noqa: E402
    SHARED_MEMORY_LIMIT,
    WIDE_TILES,
    shared_bytes,
    wide_linear,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(rows, n, k, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(DEVICE, dtype)
    return x, w


@pytest.mark.parametrize("rows,n,k", [(64, 64, 128), (130, 72, 192), (17, 200, 96)])
@pytest.mark.parametrize("split_k", [1, 2, 3, 8])
def test_matches_torch_at_every_split(rows, n, k, split_k):
    x, w = _case(rows, n, k, torch.float32, seed=rows + split_k)
    got = wide_linear(x, w, (64, 64, 32, 4, 2), split_k)
    torch.testing.assert_close(got, F.linear(x, w), atol=1e-4, rtol=1e-4)
    assert not arrival_counters(torch.device(DEVICE)).any()  # every counter left at zero


def test_float16_rounds_once_like_f_linear():
    x, w = _case(128, 96, 256, torch.float16, seed=3)
    want = F.linear(x.float(), w.float()).half()  # float32 products and sums, cast once
    for split_k in (1, 4):
        got = wide_linear(x, w, (128, 64, 64, 4, 2), split_k)
        assert got.dtype == torch.float16 and got.shape == (128, 96)
        torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)


def test_a_reduction_not_a_whole_number_of_chunks():
    x, w = _case(40, 48, 100, torch.float32, seed=5)  # the last chunk of K is masked
    for split_k in (1, 2):
        got = wide_linear(x, w, (64, 64, 32, 4, 2), split_k)
        torch.testing.assert_close(got, F.linear(x, w), atol=1e-4, rtol=1e-4)


def test_strided_rows():
    x, w = _case(64, 64, 64, torch.float32, seed=7)
    wide = torch.cat([x, x], dim=1)[:, :64]  # row stride 128
    torch.testing.assert_close(wide_linear(wide, w, (64, 64, 32, 4, 2)), F.linear(x, w),
                               atol=1e-4, rtol=1e-4)  # fmt: skip


def test_every_listed_launch_fits_hopper():
    assert all(shared_bytes(t) <= SHARED_MEMORY_LIMIT for t in WIDE_TILES)
