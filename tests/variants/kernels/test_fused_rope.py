"""Fused RoPE + KV-cache write (and the packed rotated keys a prefill attends over) against
apply_rope and index_copy_."""

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from variants.kernels.fused_rope import rope_and_cache_write, rope_launch  # noqa: E402
from variants.layers.rope import RopeTable, apply_rope  # noqa: E402

# The small float32 cases run on the GPU where there is one (Triton needs device tensors there).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _run_case(tokens, heads, kv_heads, d, dtype, device, slots=64, seed=0, launch=None,
              table=False):  # fmt: skip
    """`table`: the kernel gets the whole cos / sin tables and the positions, not the rows."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=gen).to(device, dtype)
    # strided views, as the fused QKV projection hands them over
    q, k, v = qkv.split((heads * d, kv_heads * d, kv_heads * d), dim=-1)
    q, k, v = q.view(-1, heads, d), k.view(-1, kv_heads, d), v.view(-1, kv_heads, d)
    rope = RopeTable(d, 4096, 10000.0, device, dtype)
    positions = torch.randint(0, 4096, (tokens,), generator=gen).to(device)
    cos, sin = rope.at(positions)
    write_index = torch.randperm(slots, generator=gen)[:tokens].to(device)
    k_pool = torch.zeros(slots, kv_heads, d, device=device, dtype=dtype)
    v_pool = torch.zeros_like(k_pool)
    k_rot = torch.full((tokens, kv_heads, d), float("nan"), device=device, dtype=dtype)
    given = (rope.cos, rope.sin, positions) if table else (cos, sin, None)
    q_rot = rope_and_cache_write(
        q, k, v, given[0], given[1], k_pool, v_pool, write_index, k_out=k_rot, launch=launch,
        positions=given[2],
    )  # fmt: skip

    k_ref, v_ref = torch.zeros_like(k_pool), torch.zeros_like(v_pool)
    k_ref.index_copy_(0, write_index, apply_rope(k, cos, sin))
    v_ref.index_copy_(0, write_index, v)
    got = (q_rot, k_pool, v_pool, k_rot)
    return got, (apply_rope(q, cos, sin), k_ref, v_ref, apply_rope(k, cos, sin))


@pytest.mark.parametrize("heads,kv_heads,d", [(4, 2, 24), (2, 2, 48), (3, 1, 16), (2, 1, 6)])
@pytest.mark.parametrize("launch", [None, (2, 1), (4, 2)])
def test_rope_and_cache_write_matches_torch(heads, kv_heads, d, launch):
    """5 tokens: one a program, or 2 and 4 a program with the last program part empty; head
    dims padded to a power of two (24 -> 32, 6 -> 8) and head counts too (3)."""
    got, want = _run_case(5, heads, kv_heads, d, torch.float32, DEVICE, launch=launch)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("launch", [(1, 2), (4, 2)])
def test_the_whole_tables_read_at_the_positions_give_the_gathered_rows_result(launch):
    """cos / sin as the whole tables, each token's read at its position inside the kernel:
    bit for bit as with the rows gathered before it (a last program part empty at 4 a
    program)."""
    table, want = _run_case(7, 2, 1, 24, torch.float32, DEVICE, launch=launch, table=True)
    rows, _ = _run_case(7, 2, 1, 24, torch.float32, DEVICE, launch=launch)
    for t, r, w in zip(table, rows, want):
        assert torch.equal(t, r)
        torch.testing.assert_close(t, w, atol=1e-6, rtol=1e-6)


def test_launch_by_token_count():
    assert rope_launch(1) == rope_launch(128) == (1, 2)  # decode steps: a token a program
    assert rope_launch(129) == rope_launch(8192) == (2, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens", [8, 511])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("table", [False, True], ids=["rows", "table"])
def test_gpu_rope_and_cache_write(tokens, dtype, table):
    got, want = _run_case(tokens, 4, 4, 192, dtype, "cuda", slots=1024, table=table)
    # Within one rounding of the compute dtype: the kernel may contract x0*c - x1*s into a fused
    # multiply-add (one rounding where torch rounds twice); seen on the H200, 2026-11-29: up to
    # 1 ulp apart and exact zeros in torch that come out as a few ulps of the inputs' scale.
    eps = torch.finfo(dtype).eps
    for g, w in zip(got, want):
        scale = w.abs().max().item()
        torch.testing.assert_close(g, w, atol=2 * eps * scale, rtol=eps)


def test_k_out_is_optional():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 2, 16, generator=gen).to(DEVICE) for _ in range(3))
    rope = RopeTable(16, 64, 10000.0, DEVICE, torch.float32)
    cos, sin = rope.at(torch.tensor([0, 5, 9], device=DEVICE))
    k_pool, v_pool = torch.zeros(8, 2, 16, device=DEVICE), torch.zeros(8, 2, 16, device=DEVICE)
    index = torch.tensor([7, 0, 3], device=DEVICE)
    q_rot = rope_and_cache_write(q, k, v, cos, sin, k_pool, v_pool, index)
    torch.testing.assert_close(q_rot, apply_rope(q, cos, sin), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(k_pool[index], apply_rope(k, cos, sin), atol=1e-6, rtol=1e-6)
