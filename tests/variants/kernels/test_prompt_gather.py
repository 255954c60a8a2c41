"""A prefill graph's first kernel: the metadata copied from the host buffer, each row's id
gathered from its own prompt tensor, the range check of the live rows and their embedding."""

import array

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from variants.deferred_check import DeferredRangeCheck  # noqa: E402
from variants.kernels.prompt_gather import (  # noqa: E402
    CHECK_BLOCK,
    EMBED_COLS,
    ROWS,
    gather_check_embed,
    gathered_embedding,
    prompt_sources,
)


def _host(meta: list, n: int, n_at: int, sources: list, rows: int, gap: int = 3) -> tuple:
    """A host buffer as the graphs lay it out: meta, the count at n_at, `gap` spare slots,
    then each row's source (padding rows 0). Returns it and the sources' offset."""
    values = array.array("q", meta)
    values[n_at] = n
    source_at = len(values) + gap
    values += array.array("q", [-1] * gap)
    for source, count in sources:
        values += array.array("q", [source] * count)
    values += array.array("q", [0] * (rows - (len(values) - source_at)))
    return torch.tensor(values, dtype=torch.long), source_at


def _run(make_table, prompts, rows, vocab=256, hidden=24, meta_size=None, table=None):
    base = torch.zeros(4, dtype=torch.long)
    n = sum(p.numel() for p in prompts)
    meta_size = 2 * rows + 9 if meta_size is None else meta_size
    meta_values = [1000 + i for i in range(meta_size)]
    host, source_at = _host(meta_values, n, 5, prompt_sources(prompts, base), rows)
    meta = torch.full((meta_size,), -7, dtype=torch.long)
    extremes = torch.zeros(2, dtype=torch.long)
    table = make_table(vocab, hidden) if table is None else table
    x = gather_check_embed(host, meta, base, rows, 5, source_at, vocab, extremes, table)
    want_meta = torch.tensor(meta_values)
    want_meta[5] = n
    return x, meta, want_meta, extremes, table


def test_rows_come_from_their_own_prompts_and_padding_rows_embed_id_0(embedding_table):
    """Three separate tensors, one a view into a larger one, at addresses on both sides of
    the base; two padding rows."""
    big = torch.arange(90, 120)
    prompts = [torch.tensor([5, 6, 7]), big[4:8], torch.tensor([200])]
    x, meta, want_meta, extremes, table = _run(embedding_table, prompts, rows=10)
    ids = [5, 6, 7, 94, 95, 96, 97, 200, 0, 0]
    assert torch.equal(x, table[ids])
    assert torch.equal(meta, want_meta)
    assert extremes.tolist() == [5, 200]


def test_the_check_sees_raw_ids_and_the_rows_are_clamped(embedding_table):
    prompts = [torch.tensor([-4, 3]), torch.tensor([256, 9, 10**12])]
    x, _, _, extremes, table = _run(embedding_table, prompts, rows=5, vocab=256)
    assert extremes.tolist() == [-4, 10**12]
    assert torch.equal(x, table[[0, 3, 255, 9, 255]])


def test_padding_rows_are_not_checked(embedding_table):
    """Padding rows read id 0 but stay out of the extremes (a call of ids 7-9 has min 7)."""
    x, _, _, extremes, table = _run(embedding_table, [torch.tensor([7, 8, 9])], rows=16)
    assert extremes.tolist() == [7, 9]
    assert torch.equal(x[3:], table[[0] * 13])


def test_the_check_runs_over_several_passes_and_a_long_metadata_is_copied_whole(embedding_table):
    """More live rows than a pass of the check, a bad id in the last (partial) pass, and a
    metadata copy longer than one element a program."""
    gen = torch.Generator().manual_seed(5)
    first = torch.randint(0, 4096, (CHECK_BLOCK + 20,), generator=gen)
    second = torch.randint(0, 4096, (CHECK_BLOCK,), generator=gen)
    second[-1] = -2
    rows = 2 * CHECK_BLOCK + 40
    x, meta, want_meta, extremes, table = _run(
        embedding_table, [first, second], rows=rows, vocab=4096, hidden=8, meta_size=5 * rows + 3
    )
    assert extremes.tolist() == [-2, int(torch.cat([first, second]).max())]
    assert torch.equal(meta, want_meta)
    ids = torch.cat([first, second.clamp(min=0), torch.zeros(20, dtype=torch.long)])
    assert torch.equal(x, table[ids])


def test_rows_wider_than_a_pass_come_whole_from_a_strided_table_over_several_programs(
    embedding_table,
):
    """Hidden sizes past EMBED_COLS and not a power of two, a row stride longer than the row,
    and a row count that leaves the last program part empty."""
    table = embedding_table(50, 2 * EMBED_COLS + 40, torch.bfloat16)[:, : 2 * EMBED_COLS + 8]
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 50, (ROWS + 3,), generator=gen), torch.tensor([49, 0])]
    rows = 2 * ROWS + 5
    x, _, _, extremes, _ = _run(embedding_table, prompts, rows=rows, vocab=50, table=table)
    ids = torch.cat([*prompts, torch.zeros(rows - ROWS - 5, dtype=torch.long)])
    assert x.shape == (rows, 2 * EMBED_COLS + 8) and x.dtype == torch.bfloat16
    assert torch.equal(x, table[ids])
    assert extremes.tolist() == [0, 49]


def test_sources_count_from_the_base_less_each_prompt_s_first_row():
    base = torch.arange(20)
    prompts = [base[5:8], base[:2], base[12:13]]
    assert prompt_sources(prompts, base) == [(5, 3), (0 - 3, 2), (12 - 5, 1)]
    # the base's address and the lengths as a caller already has them: the same sources
    assert prompt_sources(prompts, base.data_ptr(), [3, 2, 1]) == prompt_sources(prompts, base)


def test_off_cuda_the_check_reads_the_extremes_at_once(embedding_table):
    check = DeferredRangeCheck(torch.device("cpu"), in_graph=True)
    prompts = [torch.tensor([1, 300])]
    base = torch.zeros(1, dtype=torch.long)
    host, source_at = _host([0] * 6, 2, 5, prompt_sources(prompts, base), rows=2)
    table = embedding_table(256, 4)
    meta = torch.zeros(6, dtype=torch.long)
    x = gathered_embedding(check, host, meta, base, 2, 5, source_at, 256, table)
    assert torch.equal(x, table[[1, 255]])
    assert "token id 300" in check.error(256, "prefill")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_reads_pinned_host_memory_and_prompts_anywhere_on_the_device(embedding_table):
    """The host buffer and the extremes pinned, as the graphs hold them; prompts allocated
    apart; fp16 and bf16 tables at the public hidden size."""
    gen = torch.Generator().manual_seed(1)
    lengths = [128, 1, 77, 300]
    prompts = [torch.randint(0, 4096, (n,), generator=gen).cuda() for n in lengths]
    prompts[2][10] = 4096 + 3
    base = torch.zeros(8, dtype=torch.long, device="cuda")
    rows, meta_size = 512, 1345
    host, source_at = _host(list(range(meta_size)), sum(lengths), 5,
                            prompt_sources(prompts, base), rows)  # fmt: skip
    host = host.pin_memory()
    extremes = torch.zeros(2, dtype=torch.long).pin_memory()
    meta = torch.zeros(meta_size, dtype=torch.long, device="cuda")
    ids = torch.cat(prompts).clamp(0, 4095).cpu()
    ids = torch.cat([ids, torch.zeros(rows - ids.numel(), dtype=torch.long)])
    for dtype in (torch.float16, torch.bfloat16):
        table = embedding_table(4096, 768, dtype).cuda()
        x = gather_check_embed(host, meta, base, rows, 5, source_at, 4096, extremes, table)
        torch.cuda.synchronize()
        assert torch.equal(x.cpu(), table.cpu()[ids])
        assert extremes.tolist() == [int(torch.cat(prompts).min()), 4096 + 3]
        assert torch.equal(meta.cpu(), host[:meta_size])
