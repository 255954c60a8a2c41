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
def test_gpu_the_kernel_check_in_a_graph_is_read_before_the_graph_ends():
    """Captured with a ~50 ms sleep after it: each replay's extremes (written by the kernel
    into pinned memory) are its own and are read while the graph still runs; the graph's ids
    come out clamped."""
    device = torch.device("cuda")
    check = DeferredRangeCheck(device, in_graph=True)
    if not check.in_graph:
        pytest.skip("this PyTorch records no events inside graphs")
    tokens = torch.zeros(8, dtype=torch.long, device=device)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        checked_ids(check, tokens, 256)
        torch.cuda._sleep(100_000_000)  # cycles: about 50 ms at the H200's 1.98 GHz
    torch.cuda.synchronize(device)
    finished = torch.cuda.Event()
    for ids, want in (([3] * 8, None), ([5, 300] + [0] * 6, 300), ([-2] + [9] * 7, -2)):
        tokens.copy_(torch.tensor(ids, device=device))
        graph.replay()
        finished.record()
        message = check.error(256, "decode")
        assert not finished.query()  # the graph is still sleeping
        assert message is None if want is None else f"token id {want} is outside" in message
        torch.cuda.synchronize(device)
        assert tokens.tolist() == [min(max(i, 0), 255) for i in ids]
