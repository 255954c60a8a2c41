"""A graph step's inputs in one kernel: the range check (its extremes written to pinned memory),
the clamp and the embedding."""

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from variants.deferred_check import DeferredRangeCheck  # noqa: E402
from variants.kernels.token_check import (  # noqa: E402
    CHECK_BLOCK,
    EMBED_BLOCK,
    check_clamp_embed,
    checked_embedding,
)


def test_the_extremes_are_the_raw_ids_and_the_rows_are_the_clamped_ids(embedding_table):
    tokens = torch.tensor([5, -3, 300, 7, 255, 0])
    extremes = torch.zeros(2, dtype=torch.long)
    table = embedding_table(256, 24)
    x = check_clamp_embed(tokens, 256, extremes, table)
    assert extremes.tolist() == [-3, 300]
    assert tokens.tolist() == [5, 0, 255, 7, 255, 0]
    assert torch.equal(x, table[[5, 0, 255, 7, 255, 0]])


def test_in_range_ids_pass_unchanged_over_several_passes(embedding_table):
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 4096, (2 * CHECK_BLOCK + 37,), generator=gen)
    tokens[CHECK_BLOCK + 5] = 4095  # the largest id, in the second pass
    tokens[2 * CHECK_BLOCK + 36] = 0  # the smallest, in the last (partial) pass
    want = tokens.clone()
    extremes = torch.full((2,), 99, dtype=torch.long)
    table = embedding_table(4096, 8)
    x = check_clamp_embed(tokens, 4096, extremes, table)
    assert torch.equal(tokens, want)
    assert extremes.tolist() == [0, 4095]
    assert torch.equal(x, table[want])


def test_one_bad_id_in_a_late_pass_is_found_and_clamped(embedding_table):
    tokens = torch.zeros(CHECK_BLOCK + 3, dtype=torch.long)
    tokens[CHECK_BLOCK + 1] = 10**12
    extremes = torch.zeros(2, dtype=torch.long)
    table = embedding_table(100, 16)
    x = check_clamp_embed(tokens, 100, extremes, table)
    assert extremes.tolist() == [0, 10**12]
    assert tokens.max().item() == 99 and tokens.min().item() == 0
    assert torch.equal(x[CHECK_BLOCK + 1], table[99]) and torch.equal(x[0], table[0])


def test_rows_wider_than_a_pass_are_copied_whole(embedding_table):
    """Hidden sizes past EMBED_BLOCK, and not a power of two, from a strided table."""
    wide = embedding_table(50, 2 * EMBED_BLOCK + 40, torch.bfloat16)
    table = wide[:, : 2 * EMBED_BLOCK + 8]  # a row stride longer than the row
    tokens = torch.tensor([49, 0, 17])
    x = check_clamp_embed(tokens, 50, torch.zeros(2, dtype=torch.long), table)
    assert x.shape == (3, 2 * EMBED_BLOCK + 8) and x.dtype == torch.bfloat16
    assert torch.equal(x, table[[49, 0, 17]])


def test_off_cuda_the_check_runs_its_own_min_max_a_clamp_and_a_gather(embedding_table):
    check = DeferredRangeCheck(torch.device("cpu"), in_graph=True)
    table = embedding_table(256, 4)
    tokens = torch.tensor([1, 2, 900])
    assert torch.equal(checked_embedding(check, tokens, 256, table), table[[1, 2, 255]])
    assert tokens.tolist() == [1, 2, 255]
    assert "token id 900" in check.error(256, "decode")
    assert torch.equal(checked_embedding(check, torch.tensor([3, 4]), 256, table), table[[3, 4]])
    assert check.error(256, "decode") is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_the_extremes_land_in_pinned_host_memory(embedding_table):
    """The kernel writes the host buffer itself (mapped pinned memory, no copy); in a graph
    (test_deferred_check.py) each replay's answer is then read before the graph ends."""
    tokens = torch.tensor([7, 4096, -1, 12], device="cuda")
    extremes = torch.zeros(2, dtype=torch.long, pin_memory=True)
    table = embedding_table(4096, 768).cuda()
    x = check_clamp_embed(tokens, 4096, extremes, table)
    torch.cuda.synchronize()
    assert extremes.tolist() == [-1, 4096]
    assert tokens.tolist() == [7, 4095, 0, 12]
    assert torch.equal(x, table[[7, 4095, 0, 12]])
