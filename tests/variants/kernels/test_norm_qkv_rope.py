"""Norm + QKV + RoPE + cache write in one kernel against rms_norm, F.linear, apply_rope and
index_copy_ into the pools."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="triton is not installed")

from variants.kernels.norm_qkv_rope import norm_qkv_rope  # noqa: E402
from variants.kernels.split_k import arrival_counters, split_range  # noqa: E402
from variants.kernels.staged_dot import stage_chunks  # noqa: E402
from variants.layers.rmsnorm import rms_norm  # noqa: E402
from variants.layers.rope import RopeTable, apply_rope  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(rows, heads, kv_heads, d, k, dtype, device, slots=64, seed=0, tiles=None, split_k=None,
          stage=None, table=False):  # fmt: skip
    """`table`: the kernel gets the whole cos / sin tables and the positions, not the rows."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen).to(device, dtype)
    qkv = (torch.randn((heads + 2 * kv_heads) * d, k, generator=gen) / k**0.5).to(device, dtype)
    norm = (1 + 0.1 * torch.randn(k, generator=gen)).to(device, dtype)
    rope = RopeTable(d, 1024, 10000.0, device, dtype)
    positions = torch.randint(0, 1024, (rows,), generator=gen).to(device)
    write_index = torch.randperm(slots, generator=gen)[:rows].to(device)
    k_pool = torch.zeros(slots, kv_heads, d, device=device, dtype=dtype)
    v_pool = torch.zeros_like(k_pool)
    cos, sin = rope.at(positions)
    given = (rope.cos, rope.sin, positions) if table else (cos, sin, None)
    q = norm_qkv_rope(
        x, norm, qkv, 1e-5, d, heads * d, given[0], given[1], k_pool, v_pool, write_index,
        sm_count=4, tiles=tiles, split_k=split_k, stage=stage, positions=given[2],
    )  # fmt: skip

    q_ref, k_ref, v_ref = F.linear(rms_norm(x, norm, 1e-5), qkv).split(
        (heads * d, kv_heads * d, kv_heads * d), dim=-1
    )
    k_pool_ref, v_pool_ref = torch.zeros_like(k_pool), torch.zeros_like(v_pool)
    k_pool_ref.index_copy_(0, write_index, apply_rope(k_ref.reshape(rows, kv_heads, d), cos, sin))
    v_pool_ref.index_copy_(0, write_index, v_ref.reshape(rows, kv_heads, d))
    q_ref = apply_rope(q_ref.reshape(rows, heads, d), cos, sin).flatten(1)
    return (q, k_pool, v_pool), (q_ref, k_pool_ref, v_pool_ref)


@pytest.mark.parametrize(
    "rows,heads,kv_heads,d,k", [(1, 4, 2, 24, 64), (5, 2, 2, 48, 40), (17, 3, 1, 16, 100)]
)
def test_matches_torch(rows, heads, kv_heads, d, k):
    got, want = _case(rows, heads, kv_heads, d, k, torch.float32, DEVICE, seed=rows)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_tiles_straddling_heads():
    # 16 pairs a tile against 12 pairs a head: tiles cross q/k/v and head boundaries
    got, want = _case(3, 2, 1, 24, 32, torch.float32, DEVICE, tiles=(16, 16, 4, 2))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("split_k", [2, 3])
def test_split_reduction_matches_torch_and_leaves_the_counters_zero(split_k):
    """K = 100 in 32-wide chunks (4) over 2 or 3 programs a tile; the last to arrive rotates and
    writes the cache."""
    got, want = _case(5, 2, 1, 24, 100, torch.float32, DEVICE, tiles=(16, 32, 4, 2),
                      split_k=split_k)  # fmt: skip
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    assert not arrival_counters(torch.device(DEVICE)).any()


@pytest.mark.parametrize("stage", [False, True])
@pytest.mark.parametrize("split_k", [1, 2])
def test_the_whole_tables_read_at_the_positions_give_the_gathered_rows_result(stage, split_k):
    """cos / sin as the whole tables, each row's read at its position inside the kernel: q
    and both pools bit for bit as with the rows gathered before it."""
    args = (5, 2, 1, 24, 96, torch.float32, DEVICE)
    tiles = (16, 32, 8, 2)
    table, want = _case(*args, tiles=tiles, split_k=split_k, stage=stage, table=True)
    rows, _ = _case(*args, tiles=tiles, split_k=split_k, stage=stage)
    for t, r, w in zip(table, rows, want):
        assert torch.equal(t, r)
        torch.testing.assert_close(t, w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("k,tiles,split_k", [(96, (16, 32, 8, 2), 1), (100, (16, 32, 8, 2), 2)])
def test_staged_pairs_give_the_looped_result_bit_for_bit(k, tiles, split_k):
    """The even and odd weight rows loaded at once before the (here absent) wait: q and both
    pools as the pipelined loop writes them, and as torch does."""
    block_n, block_k, warps, _ = tiles
    split_len = split_range(k, block_k, split_k)
    assert stage_chunks(16, block_n, block_k, warps, split_len, elem=4, weight_tiles=2) > 0
    args = (5, 2, 1, 24, k, torch.float32, DEVICE)
    staged, want = _case(*args, tiles=tiles, split_k=split_k, stage=True)
    looped, _ = _case(*args, tiles=tiles, split_k=split_k, stage=False)
    for s, lp, w in zip(staged, looped, want):
        assert torch.equal(s, lp)
        torch.testing.assert_close(s, w, atol=1e-5, rtol=1e-5)
    assert not arrival_counters(torch.device(DEVICE)).any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 8, 16])
@pytest.mark.parametrize("tiles,split_k", [((32, 128, 8, 3), 2), ((16, 128, 4, 3), 2)])
def test_gpu_staged_half_matches_torch(rows, tiles, split_k):
    got, want = _case(rows, 4, 4, 192, 768, torch.float16, "cuda", slots=1024, seed=rows,
                      tiles=tiles, split_k=split_k, stage=True)  # fmt: skip
    for g, w in zip(got, want):
        scale = w.abs().max().item()
        torch.testing.assert_close(g, w, atol=4e-3 * scale, rtol=2e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [1, 8, 64])
@pytest.mark.parametrize("split_k", [None, 1, 3])
@pytest.mark.parametrize("table", [False, True], ids=["rows", "table"])
def test_gpu_half_matches_torch(rows, split_k, table):
    got, want = _case(rows, 4, 4, 192, 768, torch.float16, "cuda", slots=1024, seed=rows,
                      split_k=split_k, table=table)  # fmt: skip
    for g, w in zip(got, want):
        scale = w.abs().max().item()
        torch.testing.assert_close(g, w, atol=4e-3 * scale, rtol=2e-3)
