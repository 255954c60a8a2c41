"""Fused interleaved RoPE on q and k plus the KV-cache write, a token or two a program.

Wins in decode over eager RoPE (a dozen small launches for q and k) followed by two index_copy_
launches into the pools. Reads q/k/v straight from the strided views of the fused QKV output;
rounds each product like the eager reference. Needs Triton >= 3.0 and an even head_dim."""

import torch
import triton
import triton.language as tl

from variants.kernels.pdl import launch_options, wait_previous
from variants.kernels.split_k import host_cdiv


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
def _heads_tile(ptr, t, t_mask, stride_t, stride_h, stride_d, HEADS: tl.constexpr,
                HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """[BLOCK_T, BLOCK_H, BLOCK_D] of tokens t's heads, each head's dims contiguous (zeros past
    HEADS, HEAD_DIM and the live tokens), and its mask."""
    h = tl.arange(0, BLOCK_H)
    dd = tl.arange(0, BLOCK_D)
    mask = t_mask[:, None, None] & (h < HEADS)[None, :, None] & (dd < HEAD_DIM)[None, None, :]
    at = t[:, None, None] * stride_t + h[None, :, None] * stride_h + dd[None, None, :] * stride_d
    return tl.load(ptr + at, mask=mask, other=0.0), mask


@triton.jit
def _rotate_tile(x, c, s, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """RoPE on a [BLOCK_T, BLOCK_H, BLOCK_D] tile loaded whole: its interleaved pairs split in
    registers (not two loads with a stride of 2), rotated, joined back."""
    x0, x1 = tl.split(tl.reshape(x, [BLOCK_T, BLOCK_H, BLOCK_D // 2, 2]))
    r0, r1 = rotate_pairs(x0, x1, c[:, None, :], s[:, None, :])
    return tl.reshape(tl.join(r0, r1), [BLOCK_T, BLOCK_H, BLOCK_D])


@triton.jit
def _rope_cache_write_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, pos_ptr, k_pool_ptr, v_pool_ptr, index_ptr, q_out_ptr,
    k_out_ptr, tokens, stride_qt, stride_qh, stride_qd, stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd, stride_ct, stride_st, stride_kpt, stride_kph, stride_vpt,
    stride_vph, stride_ot, stride_oh, stride_kot, stride_koh,
    HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr, STORE_K: tl.constexpr,
    PDL: tl.constexpr, ROPE_TABLE: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_mask = t < tokens
    rows = t
    if ROPE_TABLE:  # cos / sin are the whole tables, read at each token's position (staged
        # before the step's first kernel, so before the wait: pdl.py)
        rows = tl.load(pos_ptr + t, mask=t_mask, other=0)
    wait_previous(PDL)  # q, k and v come from the projection before
    j = tl.arange(0, BLOCK_D // 2)
    cs_mask = t_mask[:, None] & (j < HEAD_DIM // 2)[None, :]
    c = tl.load(cos_ptr + rows[:, None] * stride_ct + j[None, :], mask=cs_mask, other=0.0)
    s = tl.load(sin_ptr + rows[:, None] * stride_st + j[None, :], mask=cs_mask, other=0.0)
    c, s = c.to(tl.float32), s.to(tl.float32)
    slot = tl.load(index_ptr + t, mask=t_mask, other=0).to(tl.int64)[:, None, None]
    hq = tl.arange(0, BLOCK_HQ)[None, :, None]
    hk = tl.arange(0, BLOCK_HK)[None, :, None]
    dd = tl.arange(0, BLOCK_D)[None, None, :]

    q, q_mask = _heads_tile(q_ptr, t, t_mask, stride_qt, stride_qh, stride_qd, HEADS, HEAD_DIM,
                            BLOCK_HQ, BLOCK_D)  # fmt: skip
    k, k_mask = _heads_tile(k_ptr, t, t_mask, stride_kt, stride_kh, stride_kd, KV_HEADS,
                            HEAD_DIM, BLOCK_HK, BLOCK_D)  # fmt: skip
    v, _ = _heads_tile(v_ptr, t, t_mask, stride_vt, stride_vh, stride_vd, KV_HEADS, HEAD_DIM,
                       BLOCK_HK, BLOCK_D)  # fmt: skip
    q_rot = _rotate_tile(q, c, s, BLOCK_T, BLOCK_HQ, BLOCK_D)
    tl.store(q_out_ptr + t[:, None, None] * stride_ot + hq * stride_oh + dd, q_rot, mask=q_mask)
    k_rot = _rotate_tile(k, c, s, BLOCK_T, BLOCK_HK, BLOCK_D)
    tl.store(k_pool_ptr + slot * stride_kpt + hk * stride_kph + dd,
             k_rot.to(k_pool_ptr.dtype.element_ty), mask=k_mask)  # fmt: skip
    # V is copied as loaded
    tl.store(v_pool_ptr + slot * stride_vpt + hk * stride_vph + dd,
             v.to(v_pool_ptr.dtype.element_ty), mask=k_mask)  # fmt: skip
    if STORE_K:  # the rotated keys also packed by token, as the cache holds them
        tl.store(k_out_ptr + t[:, None, None] * stride_kot + hk * stride_koh + dd,
                 k_rot.to(k_out_ptr.dtype.element_ty), mask=k_mask)  # fmt: skip


def rope_launch(tokens: int) -> tuple:
    """(tokens a program, warps): one token over two warps up to 128 tokens, two above, the
    fastest tried in CUDA graphs (experiments/bench_kernels.py times it): ahead of one-token
    programs of four warps, and of eight-token programs at 64-512 tokens."""
    return (1, 2) if tokens <= 128 else (2, 2)


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
    launch: tuple | None = None,
    pdl: bool = False,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [N, heads, d], k/v [N, kv_heads, d] (any strides); cos/sin [N, d/2] in the compute
    dtype, or with `positions` [N] the whole tables [max_positions, d/2] that the kernel reads
    each token's position of (no gathers before it); pools [slots, kv_heads, d] with unit last
    stride; write_index [N] token slot per row.
    Writes RoPE(k) and v into the pools in place and returns RoPE(q) as a new [N, heads, d].
    `k_out` ([N, kv_heads, d], unit last stride) also receives RoPE(k) in its dtype: a prefill
    attends over it without reading the keys back from the pool. `launch` = (tokens a program,
    warps) overrides `rope_launch`. `pdl`: launched with programmatic dependent launch
    (kernels/pdl.py)."""
    tokens, heads, d = q.shape
    kv_heads = k.shape[1]
    assert d % 2 == 0 and k_pool.stride(-1) == 1 and v_pool.stride(-1) == 1
    assert cos.stride(-1) == 1 and sin.stride(-1) == 1
    if k_out is not None:
        assert k_out.shape == (tokens, kv_heads, d) and k_out.stride(-1) == 1
    if positions is not None:
        assert positions.shape == (tokens,) and cos.shape[1] * 2 == d
    q_out = torch.empty(tokens, heads, d, device=q.device, dtype=q.dtype)
    ko = q_out if k_out is None else k_out  # unread without STORE_K
    block_t, warps = launch or rope_launch(tokens)
    _rope_cache_write_kernel[(host_cdiv(tokens, block_t),)](
        q, k, v, cos, sin, write_index if positions is None else positions, k_pool, v_pool,
        write_index, q_out, ko, tokens,
        *q.stride(), *k.stride(), *v.stride(), cos.stride(0), sin.stride(0),
        k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
        q_out.stride(0), q_out.stride(1), ko.stride(0), ko.stride(1),
        HEADS=heads, KV_HEADS=kv_heads, HEAD_DIM=d, BLOCK_T=block_t,
        BLOCK_HQ=triton.next_power_of_2(heads), BLOCK_HK=triton.next_power_of_2(kv_heads),
        BLOCK_D=max(2, triton.next_power_of_2(d)), STORE_K=k_out is not None, PDL=pdl,
        ROPE_TABLE=positions is not None, num_warps=warps, **launch_options(pdl, q.device),
    )  # fmt: skip
    return q_out
