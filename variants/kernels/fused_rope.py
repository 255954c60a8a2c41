"""Fused interleaved RoPE on q and k plus the KV-cache write, one program per token.

Wins in decode over eager RoPE (a dozen small launches for q and k) followed by two index_copy_
launches into the pools. Reads q/k/v straight from the strided views of the fused QKV output;
rounds each product like the eager reference. Needs Triton >= 3.0 and an even head_dim."""

import torch
import triton
import triton.language as tl


@triton.jit
def rotate_pairs(x0, x1, c, s):
    # (x0*c - x1*s, x0*s + x1*c) with every product and sum rounded to the compute dtype, as
    # eager torch does for half tensors (and no fused multiply-add across the roundings).
    dt = x0.dtype
    a = (x0.to(tl.float32) * c).to(dt).to(tl.float32)
    b = (x1.to(tl.float32) * s).to(dt).to(tl.float32)
    e = (x0.to(tl.float32) * s).to(dt).to(tl.float32)
    f = (x1.to(tl.float32) * c).to(dt).to(tl.float32)
    return (a - b).to(dt), (e + f).to(dt)


@triton.jit
def _rope_cache_write_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, k_pool_ptr, v_pool_ptr, index_ptr, q_out_ptr,
    k_out_ptr, stride_qt, stride_qh, stride_qd, stride_kt, stride_kh, stride_kd, stride_vt,
    stride_vh, stride_vd, stride_ct, stride_st, stride_kpt, stride_kph, stride_vpt, stride_vph,
    stride_ot, stride_oh, stride_kot, stride_koh,
    HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
    STORE_K: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)
    j_mask = j < HEAD_DIM // 2
    c = tl.load(cos_ptr + t * stride_ct + j, mask=j_mask, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + t * stride_st + j, mask=j_mask, other=0.0).to(tl.float32)
    c, s = c[None, :], s[None, :]

    hq = tl.arange(0, BLOCK_HQ)
    q_mask = (hq < HEADS)[:, None] & j_mask[None, :]
    q_base = q_ptr + t * stride_qt + hq[:, None] * stride_qh + (2 * j[None, :]) * stride_qd
    q0 = tl.load(q_base, mask=q_mask, other=0.0)
    q1 = tl.load(q_base + stride_qd, mask=q_mask, other=0.0)
    r0, r1 = rotate_pairs(q0, q1, c, s)
    o_base = q_out_ptr + t * stride_ot + hq[:, None] * stride_oh + 2 * j[None, :]
    tl.store(o_base, r0, mask=q_mask)
    tl.store(o_base + 1, r1, mask=q_mask)

    slot = tl.load(index_ptr + t).to(tl.int64)
    hk = tl.arange(0, BLOCK_HK)
    k_mask = (hk < KV_HEADS)[:, None] & j_mask[None, :]
    k_base = k_ptr + t * stride_kt + hk[:, None] * stride_kh + (2 * j[None, :]) * stride_kd
    k0 = tl.load(k_base, mask=k_mask, other=0.0)
    k1 = tl.load(k_base + stride_kd, mask=k_mask, other=0.0)
    r0, r1 = rotate_pairs(k0, k1, c, s)
    kp_base = k_pool_ptr + slot * stride_kpt + hk[:, None] * stride_kph + 2 * j[None, :]
    tl.store(kp_base, r0.to(k_pool_ptr.dtype.element_ty), mask=k_mask)
    tl.store(kp_base + 1, r1.to(k_pool_ptr.dtype.element_ty), mask=k_mask)
    if STORE_K:  # the rotated keys also packed by token, as the cache holds them
        ko_base = k_out_ptr + t * stride_kot + hk[:, None] * stride_koh + 2 * j[None, :]
        tl.store(ko_base, r0.to(k_out_ptr.dtype.element_ty), mask=k_mask)
        tl.store(ko_base + 1, r1.to(k_out_ptr.dtype.element_ty), mask=k_mask)

    # V is copied as the same pairs, so one index layout serves all three tensors.
    v_base = v_ptr + t * stride_vt + hk[:, None] * stride_vh + (2 * j[None, :]) * stride_vd
    v0 = tl.load(v_base, mask=k_mask, other=0.0)
    v1 = tl.load(v_base + stride_vd, mask=k_mask, other=0.0)
    vp_base = v_pool_ptr + slot * stride_vpt + hk[:, None] * stride_vph + 2 * j[None, :]
    tl.store(vp_base, v0.to(v_pool_ptr.dtype.element_ty), mask=k_mask)
    tl.store(vp_base + 1, v1.to(v_pool_ptr.dtype.element_ty), mask=k_mask)


def rope_and_cache_write(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    write_index: torch.Tensor,
    k_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [N, heads, d], k/v [N, kv_heads, d] (any strides); cos/sin [N, d/2] in the compute
    dtype; pools [slots, kv_heads, d] with unit last stride; write_index [N] token slot per row.
    Writes RoPE(k) and v into the pools in place and returns RoPE(q) as a new [N, heads, d].
    `k_out` ([N, kv_heads, d], unit last stride) also receives RoPE(k) in its dtype: a prefill
    attends over it without reading the keys back from the pool."""
    tokens, heads, d = q.shape
    kv_heads = k.shape[1]
    assert d % 2 == 0 and k_pool.stride(-1) == 1 and v_pool.stride(-1) == 1
    assert cos.stride(-1) == 1 and sin.stride(-1) == 1
    if k_out is not None:
        assert k_out.shape == (tokens, kv_heads, d) and k_out.stride(-1) == 1
    q_out = torch.empty(tokens, heads, d, device=q.device, dtype=q.dtype)
    ko = q_out if k_out is None else k_out  # unread without STORE_K
    _rope_cache_write_kernel[(tokens,)](
        q, k, v, cos, sin, k_pool, v_pool, write_index, q_out, ko,
        *q.stride(), *k.stride(), *v.stride(), cos.stride(0), sin.stride(0),
        k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
        q_out.stride(0), q_out.stride(1), ko.stride(0), ko.stride(1),
        HEADS=heads, KV_HEADS=kv_heads, HEAD_DIM=d, BLOCK_HQ=triton.next_power_of_2(heads),
        BLOCK_HK=triton.next_power_of_2(kv_heads),
        BLOCK_HALF=triton.next_power_of_2(d // 2), STORE_K=k_out is not None, num_warps=4,
    )  # fmt: skip
    return q_out
