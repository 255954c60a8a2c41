"""Split-K flash-decoding that reads the paged (or slab) KV pool in place through the block table.

Wins at decode over gather + SDPA: no copy of the context, one launch (two with splits) per layer,
and a fixed grid valid for any kv_lens, so it can sit in a CUDA graph. Needs Triton >= 3.0 and
an even head_dim <= 256; GQA groups ride as query rows of one program per (row, kv head, split)."""

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, m_ptr, l_ptr, acc_ptr,
    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_tb,
    stride_ob, stride_oh, block_size, qk_scale_log2,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, USE_DOT: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    num_heads = tl.num_programs(1) * GROUP
    kv_len = tl.load(lens_ptr + b).to(tl.int32)
    # The split's range comes from the device-side length: one launch fits every kv_lens.
    split_len = tl.cdiv(tl.cdiv(kv_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, kv_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + offs_g
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    q_ptrs = q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    q_row = tl.sum(q.to(tl.float32), axis=0)  # the query when GROUP == 1 (a sum over one row)
    # input_precision="ieee" only matters for float32 pools (no TF32); fp16/bf16 are unaffected.

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + offs_n
        n_mask = pos < end
        block = tl.load(table_ptr + b * stride_tb + pos // block_size, mask=n_mask, other=0)
        slot = block.to(tl.int64) * block_size + pos % block_size
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + slot[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :],
                    mask=kv_mask, other=0.0)  # fmt: skip
        v = tl.load(v_ptr + slot[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :],
                    mask=kv_mask, other=0.0)  # fmt: skip
        if USE_DOT:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:  # a group of one: a dot product per key, no 16-row padding
            s = tl.sum(q_row[None, :] * k.to(tl.float32), axis=1)[None, :]
        s = tl.where(n_mask[None, :], s * qk_scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: the block holds a live position
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        p = p.to(v.dtype)  # the reference casts probabilities to the compute dtype before @ V
        if USE_DOT:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            p_row = tl.sum(p.to(tl.float32), axis=0)
            pv = tl.sum(p_row[:, None] * v.to(tl.float32), axis=0)[None, :]
            acc = acc * alpha[:, None] + pv
        m_i = m_new

    if NUM_SPLITS == 1:
        o_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # kv_len 0 (a padded graph row): zeros
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])
    else:  # partials [B, heads, splits] (+ [D]); an empty split stores m=-inf, l=0, acc=0
        row = (b * num_heads + heads) * NUM_SPLITS + split
        tl.store(m_ptr + row, m_i, mask=g_mask)
        tl.store(l_ptr + row, l_i, mask=g_mask)
        a_ptrs = acc_ptr + row[:, None] * BLOCK_D + offs_d[None, :]
        tl.store(a_ptrs, acc, mask=g_mask[:, None])


@triton.jit
def _decode_combine_kernel(
    m_ptr, l_ptr, acc_ptr, out_ptr, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < NUM_SPLITS
    row = (b * tl.num_programs(1) + h) * NUM_SPLITS + offs_s
    m = tl.load(m_ptr + row, mask=s_mask, other=float("-inf"))
    l_s = tl.load(l_ptr + row, mask=s_mask, other=0.0)
    acc = tl.load(acc_ptr + row[:, None] * BLOCK_D + offs_d[None, :], mask=s_mask[:, None],
                  other=0.0)  # fmt: skip
    # Empty splits hold m = -inf and get weight exp2(-inf) = 0; a finite reference max keeps
    # -inf - -inf = NaN out when every split is empty (kv_len 0).
    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max > float("-inf"), m_max, 0.0)
    w = tl.exp2(m - m_max)
    total = tl.sum(l_s * w, axis=0)
    o = tl.sum(acc * w[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, o.to(out_ptr.dtype.element_ty),
             mask=offs_d < HEAD_DIM)  # fmt: skip


def choose_num_splits(max_kv_len: int, batch: int, kv_heads: int, sm_count: int) -> int:
    """Enough (row, kv head, split) programs to fill about 16x the SMs, each split at least 128
    tokens (shorter splits cost more in the combine than they save), at most 16. At 64 rows x
    2048 tokens on the H200, 16 splits read the cache at 1.77-1.88 TB/s and 2-3 splits at
    1.4-1.7 (scripts/tune_decode_attention.py, docs/PERF.md): the more splits, the more loads
    in flight."""
    programs = max(1, batch * kv_heads)
    wanted = -(-16 * sm_count // programs)
    return max(1, min(16, wanted, max_kv_len // 128))


def paged_decode_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor,
    kv_lens: torch.Tensor,
    block_size: int,
    scale: float,
    num_splits: int,
    out: torch.Tensor | None = None,
    tiles: tuple | None = None,
) -> torch.Tensor:
    """q [B, heads, d]; pools [slots, kv_heads, d]; block_table [B, W] (int32 or int64; slab:
    W=1 and block_size=max_positions); kv_lens [B] (a row of length 0 gets zeros). Returns
    [B, heads, d] in q's dtype (into `out` when given). `tiles` = (BLOCK_N, num_warps,
    num_stages) overrides the defaults (scripts/tune_decode_attention.py)."""
    batch, heads, d = q.shape
    kv_heads = k_pool.shape[1]
    group = heads // kv_heads
    assert heads == group * kv_heads and k_pool.stride(-1) == 1 and v_pool.stride(-1) == 1
    assert d % 2 == 0 and d <= 256, f"head_dim {d} must be even and <= 256"
    if q.stride(-1) != 1:
        q = q.contiguous()
    if out is None:
        out = torch.empty(batch, heads, d, device=q.device, dtype=q.dtype)
    assert out.stride(-1) == 1
    block_d = max(16, triton.next_power_of_2(d))
    block_g = triton.next_power_of_2(group)
    use_dot = group > 1
    if use_dot:
        block_g = max(16, block_g)  # tl.dot needs 16 rows
    # Four warps: on the H200 (scripts/tune_decode_attention.py, docs/PERF.md) 8 warps read the
    # cache at ~0.98 TB/s at batch 64 x 2048, 4 warps at ~1.7 TB/s with the same tiles.
    block_n = 64 if block_d <= 64 else 32
    warps, stages = 4, 2
    if tiles is not None:
        block_n, warps, stages = tiles
    num_splits = max(1, int(num_splits))
    if num_splits > 1:
        m = torch.empty(batch, heads, num_splits, device=q.device, dtype=torch.float32)
        l_s = torch.empty_like(m)
        acc = torch.empty(batch, heads, num_splits, block_d, device=q.device, dtype=torch.float32)
    else:
        m = l_s = acc = out  # unused: the kernel writes the output directly
    _decode_split_kernel[(batch, kv_heads, num_splits)](
        q, k_pool, v_pool, block_table, kv_lens, out, m, l_s, acc,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0),
        v_pool.stride(1), block_table.stride(0), out.stride(0), out.stride(1), block_size,
        scale * math.log2(math.e),
        GROUP=group, HEAD_DIM=d, NUM_SPLITS=num_splits, BLOCK_G=block_g, BLOCK_N=block_n,
        BLOCK_D=block_d, USE_DOT=use_dot, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    if num_splits > 1:
        _decode_combine_kernel[(batch, heads)](
            m, l_s, acc, out, out.stride(0), out.stride(1),
            HEAD_DIM=d, NUM_SPLITS=num_splits, BLOCK_S=triton.next_power_of_2(num_splits),
            BLOCK_D=block_d, num_warps=4,
        )  # fmt: skip
    return out
