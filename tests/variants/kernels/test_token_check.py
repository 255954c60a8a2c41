"""The graphs' range check and clamp in one kernel, its extremes written to pinned memory."""

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from variants.deferred_check import DeferredRangeCheck  # noqa: E402
from variants.kernels.token_check import CHECK_BLOCK, check_and_clamp, checked_ids  # noqa: E402


def test_the_extremes_are_the_raw_ids_and_the_ids_are_clamped_in_place():
    tokens = torch.tensor([5, -3, 300, 7, 255, 0])
    extremes = torch.zeros(2, dtype=torch.long)
    out = check_and_clamp(tokens, 256, extremes)
    assert out is tokens
    assert extremes.tolist() == [-3, 300]
    assert tokens.tolist() == [5, 0, 255, 7, 255, 0]


def test_in_range_ids_pass_unchanged_over_several_passes():
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 4096, (2 * CHECK_BLOCK + 37,), generator=gen)
    tokens[CHECK_BLOCK + 5] = 4095  # the largest id, in the second pass
    tokens[2 * CHECK_BLOCK + 36] = 0  # the smallest, in the last (partial) pass
    want = tokens.clone()
    extremes = torch.full((2,), 99, dtype=torch.long)
    check_and_clamp(tokens, 4096, extremes)
    assert torch.equal(tokens, want)
    assert extremes.tolist() == [0, 4095]


def test_one_bad_id_in_a_late_pass_is_found_and_clamped():
    tokens = torch.zeros(CHECK_BLOCK + 3, dtype=torch.long)
    tokens[CHECK_BLOCK + 1] = 10**12
    extremes = torch.zeros(2, dtype=torch.long)
    check_and_clamp(tokens, 100, extremes)
    assert extremes.tolist() == [0, 10**12]
    assert tokens.max().item() == 99 and tokens.min().item() == 0


def test_off_cuda_the_check_runs_its_own_min_max_and_a_clamp():
    check = DeferredRangeCheck(torch.device("cpu"), in_graph=True)
    tokens = torch.tensor([1, 2, 900])
    assert checked_ids(check, tokens, 256).tolist() == [1, 2, 255]
    assert "token id 900" in check.error(256, "decode")
    assert checked_ids(check, torch.tensor([3, 4]), 256).tolist() == [3, 4]
    assert check.error(256, "decode") is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_the_extremes_land_in_pinned_host_memory():
    """The kernel writes the host buffer itself (mapped pinned memory, no copy); in a graph
    (test_deferred_check.py) each replay's answer is then read before the graph ends."""
    tokens = torch.tensor([7, 4096, -1, 12], device="cuda")
    extremes = torch.zeros(2, dtype=torch.long, pin_memory=True)
    check_and_clamp(tokens, 4096, extremes)
    torch.cuda.synchronize()
    assert extremes.tolist() == [-1, 4096]
    assert tokens.tolist() == [7, 4095, 0, 12]
