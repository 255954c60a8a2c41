"""Split-K paged decode attention against gather + float32 softmax in torch."""

import math

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import variants.kernels.decode_attention as decode_module  # noqa: E402
from variants.kernels.decode_attention import paged_decode_attention  # noqa: E402
from variants.kernels.decode_attention_rules import (  # noqa: E402
    choose_num_splits,
    split_tokens_for,
)


def reference_decode(q, k_pool, v_pool, block_table, kv_lens, block_size):
    """The contract's math per row: gather its context, float32 softmax, probs in q's dtype."""
    heads, d = q.shape[1], q.shape[2]
    group = heads // k_pool.shape[1]
    rows = []
    for b, n in enumerate(kv_lens.tolist()):
        pos = torch.arange(n, device=q.device)
        slots = block_table[b, pos // block_size].long() * block_size + pos % block_size
        k = k_pool[slots].repeat_interleave(group, dim=1).transpose(0, 1)  # [heads, n, d]
        v = v_pool[slots].repeat_interleave(group, dim=1).transpose(0, 1)
        scores = (q[b].float()[:, None, :] @ k.float().transpose(-1, -2)) / math.sqrt(d)
        rows.append((scores.softmax(-1).to(q.dtype) @ v)[:, 0])
    return torch.stack(rows)


# The small float32 cases run on the GPU where there is one (Triton needs device tensors there).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def paged_case(kv_lens, heads, kv_heads, d, block_size, dtype=torch.float32, device=DEVICE, seed=0):
    """Pools with a shuffled block table (row b owns scattered blocks), plus spare blocks."""
    gen = torch.Generator().manual_seed(seed)
    width = max(-(-n // block_size) for n in kv_lens)
    blocks = len(kv_lens) * width + 3
    table = torch.randperm(blocks, generator=gen)[: len(kv_lens) * width].view(-1, width)
    k_pool = torch.randn(blocks * block_size, kv_heads, d, generator=gen)
    v_pool = torch.randn(blocks * block_size, kv_heads, d, generator=gen)
    q = torch.randn(len(kv_lens), heads, d, generator=gen)
    lens = torch.tensor(kv_lens, dtype=torch.int32)
    to = lambda t: t.to(device, dtype)
    return to(q), to(k_pool), to(v_pool), table.to(device, torch.int32), lens.to(device)


def slab_case(kv_lens, heads, kv_heads, d, max_len, dtype=torch.float32, device=DEVICE, seed=0):
    """Slab layout: one max_len slot per request, a one-column table of (shuffled) slots."""
    gen = torch.Generator().manual_seed(seed)
    slots = len(kv_lens) + 2
    table = torch.randperm(slots, generator=gen)[: len(kv_lens)].view(-1, 1)
    k_pool = torch.randn(slots * max_len, kv_heads, d, generator=gen)
    v_pool = torch.randn(slots * max_len, kv_heads, d, generator=gen)
    q = torch.randn(len(kv_lens), heads, d, generator=gen)
    lens = torch.tensor(kv_lens, dtype=torch.int32)
    to = lambda t: t.to(device, dtype)
    return to(q), to(k_pool), to(v_pool), table.to(device, torch.int32), lens.to(device)


def check(case, block_size, num_splits, atol=1e-5, rtol=1e-5, split_tokens=1, parts=None):
    """split_tokens=1 by default: every split the grid has works, even at these short lengths.
    `parts`: how the head is cut (None: the launcher's choice)."""
    q, k_pool, v_pool, table, lens = case
    scale = 1.0 / math.sqrt(q.shape[-1])
    got = paged_decode_attention(
        q, k_pool, v_pool, table, lens, block_size, scale, num_splits, split_tokens=split_tokens,
        parts=parts,
    )  # fmt: skip
    want = reference_decode(q, k_pool, v_pool, table, lens, block_size)
    assert got.shape == q.shape and got.dtype == q.dtype
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)


# kv_lens: 1, exactly one and two blocks, ragged in between
RAGGED = [1, 16, 32, 37, 5]


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("heads,kv_heads,d", [(2, 2, 24), (4, 2, 48)])
def test_paged_ragged(num_splits, heads, kv_heads, d):
    check(paged_case(RAGGED, heads, kv_heads, d, 16), 16, num_splits)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize(
    "heads,kv_heads,d,parts",
    [(2, 2, 24, (16, 16)), (4, 2, 48, (32, 16)), (4, 1, 40, (32, 16)), (2, 2, 32, (32, 0))],
)
def test_head_in_two_parts(num_splits, heads, kv_heads, d, parts):
    """The head cut in two power-of-two parts (Hopper's choice at a program per SM), with and
    without GQA, the second part masked past head_dim (40 = 32 + 8 of 16)."""
    check(paged_case(RAGGED, heads, kv_heads, d, 16), 16, num_splits, parts=parts)


@triton.jit
def _split_tokens_probe(lens_ptr, out_ptr, split_tokens, min_programs, batch, kv_heads,
                        BLOCK_B: tl.constexpr):  # fmt: skip
    st = decode_module._grid_split_tokens(lens_ptr, split_tokens, min_programs, batch, kv_heads,
                                          BLOCK_B)  # fmt: skip
    tl.store(out_ptr, st)


@pytest.mark.parametrize(
    "lens,min_programs,want",
    [
        ([260] * 40, 660, 64),  # 4 x 40 x 5 = 800 programs at 64 tokens, 480 at 128
        ([260] * 64, 660, 128),  # 768 programs at 128 tokens
        ([260] * 40 + [0] * 24, 660, 64),  # a graph's padding rows: no work
        ([100] * 64, 660, 32),  # 4 x 64 x 2 = 512 at 64 tokens: too few
        ([516] * 48, 660, 128),  # 960
        ([1, 2, 3], 1, 128),  # any work at all when one program suffices
    ],
)
def test_splits_grow_while_enough_programs_work(lens, min_programs, want):
    lens_t = torch.tensor(lens, dtype=torch.int64, device=DEVICE)
    out = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    block_b = triton.next_power_of_2(len(lens))
    _split_tokens_probe[(1,)](lens_t, out, 32, min_programs, len(lens), 4, BLOCK_B=block_b)
    assert out.item() == want


@pytest.mark.parametrize("min_programs", [1, 10**6])
def test_grown_splits_match_the_reference(min_programs):
    """Splits of 4x split_tokens (every row qualifies at min_programs=1) or as given."""
    case = paged_case(RAGGED, 4, 2, 48, 8)
    q, k_pool, v_pool, table, lens = case
    got = paged_decode_attention(
        q, k_pool, v_pool, table, lens, 8, 48**-0.5, 4, split_tokens=2,
        min_programs=min_programs,
    )  # fmt: skip
    want = reference_decode(q, k_pool, v_pool, table, lens, 8)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_many_splits_some_empty():
    """8 splits over lengths 1..37: short rows leave most splits empty (m=-inf, l=0)."""
    check(paged_case(RAGGED, 2, 1, 24, 16), 16, 8)


@pytest.mark.parametrize("num_splits,parts", [(32, None), (33, None), (64, None), (64, (128, 64))])
def test_combine_of_many_splits_in_column_chunks(num_splits, parts):
    """32-64 splits of a 192-wide head: the combine sums [splits, columns] in chunks of
    columns (a 256-wide part in 2 or 4, a 128-wide one in 2) and must equal the reference;
    rows of 1-300 tokens leave 1-64 splits working, 16-token splits (33: a grid that is not a
    power of two, as 8 rows past LONG_CONTEXT get on the H200)."""
    case = paged_case([300, 150, 17, 1], 2, 2, 192, 16)
    check(case, 16, num_splits, atol=1e-5, rtol=1e-5, split_tokens=4, parts=parts)


def test_gqa_group_4_odd_block_size():
    check(paged_case([9, 21], 8, 2, 24, 5), 5, 2)


def test_empty_row_gives_zeros():
    """A padded row of a captured batch (kv_len 0) must not write NaN."""
    q, k_pool, v_pool, table, lens = paged_case([5, 20], 2, 2, 24, 16)
    lens[0] = 0
    for splits in (1, 3):
        out = paged_decode_attention(
            q, k_pool, v_pool, table, lens, 16, 24**-0.5, splits, split_tokens=1
        )
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        want = reference_decode(q[1:], k_pool, v_pool, table[1:], lens[1:], 16)
        torch.testing.assert_close(out[1:], want)


def test_int64_tables_and_lengths():
    q, k_pool, v_pool, table, lens = paged_case([3, 16], 2, 2, 24, 16)
    check((q, k_pool, v_pool, table.long(), lens.long()), 16, 2)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_slab_one_column_table(num_splits):
    check(slab_case([1, 64, 23], 4, 2, 48, 64), 64, num_splits)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_slab_table_of_first_tokens(num_splits):
    """`offsets`: each row's one entry is its slot's first token, whatever the slots' length,
    under one block size that covers every position (a slab laid out anew keeps its graphs)."""
    q, k_pool, v_pool, table, lens = slab_case([1, 64, 23], 4, 2, 48, 64)
    scale = 1.0 / math.sqrt(q.shape[-1])
    got = paged_decode_attention(
        q, k_pool, v_pool, table * 64, lens, 512, scale, num_splits, split_tokens=1, offsets=True
    )
    want = reference_decode(q, k_pool, v_pool, table, lens, 64)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_strided_q_and_out_buffer():
    q, k_pool, v_pool, table, lens = paged_case([7, 33], 2, 2, 24, 16)
    wide = torch.cat([q, q], dim=-1)[..., :24]  # row stride 48, last stride 1
    out = torch.full_like(q, float("nan"))
    res = paged_decode_attention(
        wide, k_pool, v_pool, table, lens, 16, 24**-0.5, 2, out=out, split_tokens=1
    )
    assert res is out
    torch.testing.assert_close(out, reference_decode(q, k_pool, v_pool, table, lens, 16))


@pytest.mark.parametrize("split_tokens", [16, 20, 64])
def test_live_splits_follow_each_rows_length(split_tokens):
    """Grid of 4 splits; a row works cdiv(len, split_tokens) of them (1 to 4): 1, 1, 2, 4, 4
    at 16 tokens a split. The last split to finish combines."""
    check(paged_case([1, 16, 17, 64, 100], 4, 2, 24, 16), 16, 4, split_tokens=split_tokens)


@pytest.mark.parametrize("num_splits", [1, 2, 3])
def test_splits_of_several_tiles(num_splits):
    """32-token tiles: rows of 150 and 300 tokens over 1-3 splits give each split several tiles
    (the online softmax across tiles, then the combine); rows of 7 and 40 one or two."""
    q, k_pool, v_pool, table, lens = paged_case([150, 300, 7, 40], 2, 2, 24, 16)
    got = paged_decode_attention(
        q, k_pool, v_pool, table, lens, 16, 24**-0.5, num_splits, tiles=(32, 4, 2),
        split_tokens=32,
    )  # fmt: skip
    torch.testing.assert_close(got, reference_decode(q, k_pool, v_pool, table, lens, 16))


def test_arrival_counters_end_at_zero_and_serve_the_next_call():
    q, k_pool, v_pool, table, lens = paged_case([40, 9, 33], 4, 2, 24, 16)
    arrivals = torch.zeros(16, dtype=torch.int32, device=q.device)
    want = reference_decode(q, k_pool, v_pool, table, lens, 16)
    for _ in range(3):  # a captured graph reuses one buffer for every layer and step
        got = paged_decode_attention(
            q, k_pool, v_pool, table, lens, 16, 24**-0.5, 3, arrivals=arrivals, split_tokens=8
        )
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert torch.equal(arrivals, torch.zeros_like(arrivals))


def test_register_cap_never_below_the_builds_own_count(monkeypatch):
    """`register_cap` compiles the build once without the cap (cached) and caps it only where
    ptxas alone takes fewer registers."""
    compiled = []

    class Build:
        def __init__(self, regs):
            self.n_regs = regs

        def _init_handles(self):
            pass

    class Kernel:
        regs = 154

        def warmup(self, *args, grid, **meta):
            compiled.append((grid, meta["NUM_SPLITS"], meta["num_warps"]))
            return Build(self.regs)

    kernel = Kernel()
    monkeypatch.setattr(decode_module, "_decode_split_kernel", kernel)
    monkeypatch.setattr(decode_module, "_OWN_REGISTERS", {})
    args, tiles = (torch.zeros(1),), (16, 1, 2)
    meta = {"NUM_SPLITS": 33}
    assert decode_module.register_cap(168, (8, 4, 33), args, meta, tiles) == {"maxnreg": 168}
    assert decode_module.register_cap(168, (8, 4, 33), args, meta, tiles) == {"maxnreg": 168}
    assert compiled == [((8, 4, 33), 33, 1)]  # once a build
    half = (torch.zeros(1, dtype=torch.float16),)  # another signature: another build
    assert decode_module.register_cap(168, (8, 4, 33), half, meta, tiles) == {"maxnreg": 168}
    assert len(compiled) == 2
    kernel.regs = 227  # another compiler: its own count is above the cap
    assert decode_module.register_cap(168, (8, 4, 16), args, {"NUM_SPLITS": 16}, tiles) == {}
    assert decode_module.register_cap(168, (8, 4, 16), args, {"NUM_SPLITS": 16}, tiles) == {}
    assert len(compiled) == 3


def test_sixteen_token_tiles_split_at_sixteen_tokens():
    """The H200's tiles below a program an SM: 16 tokens, one or two warps; left to its
    default, a split then gets 16 tokens (lengths 1 to 100 over a grid of 8 splits)."""
    assert split_tokens_for(16) == 16 and split_tokens_for(64) == split_tokens_for(128) == 32
    q, k_pool, v_pool, table, lens = paged_case([1, 16, 17, 40, 100], 4, 2, 24, 16)
    want = reference_decode(q, k_pool, v_pool, table, lens, 16)
    for warps in (1, 2):
        got = paged_decode_attention(
            q, k_pool, v_pool, table, lens, 16, 24**-0.5, 8, tiles=(16, warps, 2)
        )
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_tile_the_gpu_refuses_falls_back_to_the_small_one(monkeypatch):
    """An OutOfResources launch (shared memory on a small GPU) retries with (32, 4, 2) and is
    remembered, so later calls go straight to the small tile."""
    from triton.runtime.errors import OutOfResources

    real, tried = decode_module._launch, []

    def picky(grid, args, meta, tiles):
        tried.append(tiles)
        if tiles[0] == 64:
            raise OutOfResources(200_000, 101_376, "shared memory")
        real(grid, args, meta, tiles)

    monkeypatch.setattr(decode_module, "_launch", picky)
    monkeypatch.setattr(decode_module, "_TOO_BIG", set())
    q, k_pool, v_pool, table, lens = paged_case([40, 9], 2, 2, 24, 16)
    want = reference_decode(q, k_pool, v_pool, table, lens, 16)
    for _ in range(2):
        got = paged_decode_attention(
            q, k_pool, v_pool, table, lens, 16, 24**-0.5, 2, tiles=(64, 4, 2), split_tokens=8
        )
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert tried == [(64, 4, 2), (32, 4, 2), (32, 4, 2)]


# ------------------------------------------------------------------ GPU, public model sizes
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _sms():
    return torch.cuda.get_device_properties(0).multi_processor_count


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("batch,ctx", [(8, 150), (64, 2048)])
@pytest.mark.parametrize("splits", ["auto", 1, 4])
def test_gpu_paged_public_sizes(batch, ctx, splits):
    lens = [ctx - (i * 37) % 64 for i in range(batch)]  # ragged near ctx, one full row
    lens[0] = ctx
    case = paged_case(lens, 4, 4, 192, 16, torch.float16, "cuda")
    n = choose_num_splits(ctx, batch, 4, _sms()) if splits == "auto" else splits
    check(case, 16, n, atol=2e-3, rtol=1e-2)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("batch,ctx", [(1, 1100), (4, 3000), (8, 1500)])
def test_gpu_long_context_splits_and_tiles(batch, ctx):
    """The split count and tiles this GPU's graphs take past LONG_CONTEXT (on the H200: 64
    splits of two-warp tiles at 1-4 rows, 33 of one-warp tiles at 8) against the reference."""
    lens = [ctx - (i * 37) % 64 for i in range(batch)]
    case = paged_case(lens, 4, 4, 192, 16, torch.float16, "cuda")
    capability = torch.cuda.get_device_capability()
    n = choose_num_splits(4096, batch, 4, _sms(), capability)
    check(case, 16, n, atol=2e-3, rtol=1e-2, split_tokens=None)  # the engine's split lengths


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("regs", [0, 168])
def test_gpu_register_cap(regs):
    """A register cap (or none) on the 8-row build of 33 splits of one warp: the reference."""
    case = paged_case([1500 - 37 * i for i in range(8)], 4, 4, 192, 16, torch.float16, "cuda")
    q, k_pool, v_pool, table, lens = case
    got = paged_decode_attention(
        q, k_pool, v_pool, table, lens, 16, 192**-0.5, 33, tiles=(16, 1, 2), max_registers=regs
    )
    want = reference_decode(q, k_pool, v_pool, table, lens, 16)
    torch.testing.assert_close(got, want, atol=2e-3, rtol=1e-2)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("parts", [None, "split"])
def test_gpu_slab_and_gqa(dtype, parts):
    """The launcher's head layout, and the head forced into two parts (192 = 128 + 64; GQA at
    96 = 64 + 32, the group through tl.dot)."""
    atol = 2e-3 if dtype == torch.float16 else 1e-2
    slab = slab_case([1, 150, 2048, 77], 4, 4, 192, 2048, dtype, "cuda")
    check(slab, 2048, 4, atol, 2e-2, parts=parts and (128, 64))
    check(paged_case([1, 16, 300, 1000], 8, 2, 128, 16, dtype, "cuda"), 16, 4, atol, 2e-2)
    gqa = paged_case([1, 16, 300, 1000], 8, 2, 96, 16, dtype, "cuda")
    check(gqa, 16, 4, atol, 2e-2, parts=parts and (64, 32))


@pytest.mark.gpu
@gpu
def test_gpu_cuda_graph_replay_with_other_lengths():
    """One captured launch (fixed splits and grid) stays right when kv_lens change."""
    q, k_pool, v_pool, table, lens = paged_case([150] * 8, 4, 4, 192, 16, torch.float16, "cuda")
    scale, out = 192**-0.5, torch.empty_like(q)
    run = lambda: paged_decode_attention(q, k_pool, v_pool, table, lens, 16, scale, 4, out=out)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for new in ([1, 2, 3, 16, 17, 63, 64, 150], [150, 149, 100, 1, 1, 33, 128, 129]):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        want = reference_decode(q, k_pool, v_pool, table, lens, 16)
        torch.testing.assert_close(out, want, atol=2e-3, rtol=1e-2)


@pytest.mark.gpu
@gpu
def test_gpu_last_split_combines_only_finished_partials():
    """The arrival counter's ordering, under load: 300 launches, each with a new query and 16
    live splits a row, back to back on one counter buffer. A combine that read a partial before
    its writer's stores landed would mix in the previous launch's partials (another query): every
    launch must match the one-split result."""
    lens = [1024 - (i * 29) % 200 for i in range(64)]
    _, k_pool, v_pool, table, kv_lens = paged_case(lens, 4, 4, 192, 16, torch.float16, "cuda")
    gen = torch.Generator(device="cuda").manual_seed(5)
    queries = torch.randn(300, 64, 4, 192, device="cuda", dtype=torch.float16, generator=gen)
    arrivals = torch.zeros(256, dtype=torch.int32, device="cuda")
    scale = 192**-0.5
    split = [
        paged_decode_attention(
            q, k_pool, v_pool, table, kv_lens, 16, scale, 16, arrivals=arrivals, split_tokens=16
        )  # fmt: skip
        for q in queries
    ]
    whole = [paged_decode_attention(q, k_pool, v_pool, table, kv_lens, 16, scale, 1)
             for q in queries]  # fmt: skip
    worst = max((a.float() - b.float()).abs().max().item() for a, b in zip(split, whole))
    assert worst < 2e-3
    assert torch.equal(arrivals, torch.zeros_like(arrivals))
