"""The attention inputs of a few rows in one kernel: RMSNorm, the fused QKV projection,
interleaved RoPE on q and k, and the write of k and v into the cache pools.

Each program reads the weight rows of output columns 2j and 2j+1 for a tile of pairs j, so a
rotation pair lands in one program's registers and needs no exchange. Columns run q heads, then
k heads, then v heads (the fused QKV layout); a tile may straddle them, every lane finds its own.
Replaces, per layer of a decode step, the norm launch, the QKV GEMM and the RoPE + cache launch.
Rounds like the reference: projections cast to the compute dtype, then RoPE as eager torch does.
Needs Triton >= 3.0 and an even head_dim."""

import torch
import triton
import triton.language as tl

from variants.kernels.fused_rope import rotate_pairs
from variants.kernels.pdl import launch_options, wait_previous
from variants.kernels.prefetch import prefetch_rows
from variants.kernels.row_dot import few_row_tiles, norm_chunks
from variants.kernels.split_k import (
    counters_for,
    host_cdiv,
    pair_partials,
    reset_counter,
    split_range,
    split_workspace,
    splits_for,
    tile_counter,
)
from variants.kernels.staged_dot import project, stage_chunks, stage_chunks_of


@triton.jit
def _rope_store(
    even, odd, c, s, slot, offs_m, m_mask, col, p_mask, dim, q_ptr, k_pool_ptr, v_pool_ptr,
    stride_qm, stride_kpt, stride_kph, stride_vpt, stride_vph, dt,
    Q_DIM: tl.constexpr, KV_DIM: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    x0, x1 = even.to(dt), odd.to(dt)
    r0, r1 = rotate_pairs(x0, x1, c.to(tl.float32), s.to(tl.float32))

    is_q = p_mask & (col < Q_DIM)
    q_at = q_ptr + offs_m[:, None] * stride_qm + col[None, :]
    tl.store(q_at, r0, mask=m_mask[:, None] & is_q[None, :])
    tl.store(q_at + 1, r1, mask=m_mask[:, None] & is_q[None, :])

    is_k = p_mask & (col >= Q_DIM) & (col < Q_DIM + KV_DIM)
    k_head = tl.where(is_k, (col - Q_DIM) // HEAD_DIM, 0)
    k_at = k_pool_ptr + slot[:, None] * stride_kpt + (k_head * stride_kph + dim)[None, :]
    k_store = m_mask[:, None] & is_k[None, :]
    tl.store(k_at, r0.to(k_pool_ptr.dtype.element_ty), mask=k_store)
    tl.store(k_at + 1, r1.to(k_pool_ptr.dtype.element_ty), mask=k_store)

    is_v = p_mask & (col >= Q_DIM + KV_DIM)
    v_head = tl.where(is_v, (col - Q_DIM - KV_DIM) // HEAD_DIM, 0)
    v_at = v_pool_ptr + slot[:, None] * stride_vpt + (v_head * stride_vph + dim)[None, :]
    v_store = m_mask[:, None] & is_v[None, :]
    tl.store(v_at, x0.to(v_pool_ptr.dtype.element_ty), mask=v_store)
    tl.store(v_at + 1, x1.to(v_pool_ptr.dtype.element_ty), mask=v_store)


@triton.jit
def qkv_tile(
    m_tile, p_tile, split, counter, x_ptr, norm_ptr, w_ptr, cos_ptr, sin_ptr, index_ptr, q_ptr,
    k_pool_ptr, v_pool_ptr, ws_ptr, M, K, split_len, stride_xm, stride_wn, stride_cos,
    stride_sin, stride_qm, stride_kpt, stride_kph, stride_vpt, stride_vph, eps,
    Q_DIM: tl.constexpr, KV_DIM: tl.constexpr, HEAD_DIM: tl.constexpr,
    NORM_CHUNKS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, e0, e1, e2, e3, o0, o1, o2, o3,
    STAGED: tl.constexpr, rope_rows,
):  # fmt: skip
    """Row tile m_tile's pairs tile p_tile, reduction split `split` of SPLIT_K (`counter`: the
    tile's arrival counter when SPLIT_K > 1). STAGED > 0: the even and odd weight rows are
    already loaded, in STAGED chunks e0..e3 and o0..o3 (`stage_chunks_of`). `rope_rows`
    [BLOCK_M]: the cos / sin row of each of the tile's rows."""
    offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = p_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    p_mask = pairs < (Q_DIM + 2 * KV_DIM) // 2
    col = 2 * pairs  # the even column of each pair
    dim = col % HEAD_DIM  # q, k and v spans are whole heads, so this is the dim within a head
    # The epilogue's inputs first (addresses that need no load): their round trips overlap the
    # weight's.
    slot = tl.load(index_ptr + offs_m, mask=m_mask, other=0).to(tl.int64)
    cs_mask = m_mask[:, None] & p_mask[None, :]
    c = tl.load(cos_ptr + rope_rows[:, None] * stride_cos + (dim // 2)[None, :], mask=cs_mask,
                other=0.0)  # fmt: skip
    s = tl.load(sin_ptr + rope_rows[:, None] * stride_sin + (dim // 2)[None, :], mask=cs_mask,
                other=0.0)  # fmt: skip
    k_lo = split * split_len
    k_hi = tl.minimum(k_lo + split_len, K)
    even, odd = project(
        x_ptr, stride_xm, offs_m, m_mask, norm_ptr, eps, w_ptr, stride_wn, col, col + 1, p_mask,
        K, k_lo, k_hi, e0, e1, e2, e3, o0, o1, o2, o3, NORM_CHUNKS, SPLIT_K, True, STAGED,
        BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    dt = w_ptr.dtype.element_ty
    if SPLIT_K == 1:
        _rope_store(
            even, odd, c, s, slot, offs_m, m_mask, col, p_mask, dim, q_ptr, k_pool_ptr,
            v_pool_ptr, stride_qm, stride_kpt, stride_kph, stride_vpt, stride_vph, dt,
            Q_DIM, KV_DIM, HEAD_DIM,
        )  # fmt: skip
    else:
        last, even, odd = pair_partials(
            ws_ptr, split, counter, offs_m, pairs, cs_mask, even, odd, M,
            (Q_DIM + 2 * KV_DIM) // 2, SPLIT_K,
        )  # fmt: skip
        if last:
            _rope_store(
                even, odd, c, s, slot, offs_m, m_mask, col, p_mask, dim, q_ptr, k_pool_ptr,
                v_pool_ptr, stride_qm, stride_kpt, stride_kph, stride_vpt, stride_vph, dt,
                Q_DIM, KV_DIM, HEAD_DIM,
            )  # fmt: skip
            reset_counter(counter)


@triton.jit
def _norm_qkv_rope_kernel(
    x_ptr, norm_ptr, w_ptr, cos_ptr, sin_ptr, pos_ptr, index_ptr, q_ptr, k_pool_ptr, v_pool_ptr,
    ws_ptr, counter_ptr, M, K, split_len, stride_xm, stride_wn, stride_cos, stride_sin,
    stride_qm, stride_kpt, stride_kph, stride_vpt, stride_vph, eps,
    Q_DIM: tl.constexpr, KV_DIM: tl.constexpr, HEAD_DIM: tl.constexpr,
    NORM_CHUNKS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr,
    LANES: tl.constexpr, STAGED: tl.constexpr, ROPE_TABLE: tl.constexpr,
    EARLY_POSITIONS: tl.constexpr,
):  # fmt: skip
    rope_rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    if ROPE_TABLE and EARLY_POSITIONS:  # cos / sin are the whole tables: each row's own at its
        # position, read before a PDL wait (positions staged before the step's first kernel)
        rope_rows = tl.load(pos_ptr + rope_rows, mask=rope_rows < M, other=0)
    e0, e1, e2, e3 = 0, 0, 0, 0  # placeholders unless staged
    o0, o1, o2, o3 = 0, 0, 0, 0
    if STAGED > 0:  # this program's even and odd weight rows, in registers before the wait
        pairs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        p_mask = pairs < (Q_DIM + 2 * KV_DIM) // 2
        k_lo = tl.program_id(2) * split_len
        k_hi = tl.minimum(k_lo + split_len, K)
        e0, e1, e2, e3 = stage_chunks_of(w_ptr, stride_wn, 2 * pairs, p_mask, k_lo, k_hi,
                                         STAGED, BLOCK_K)  # fmt: skip
        o0, o1, o2, o3 = stage_chunks_of(w_ptr, stride_wn, 2 * pairs + 1, p_mask, k_lo, k_hi,
                                         STAGED, BLOCK_K)  # fmt: skip
    elif PREFETCH:  # the weight rows of this tile's pairs, shared out over row tiles and splits
        c0 = 2 * tl.program_id(0) * BLOCK_N
        prefetch_rows(
            w_ptr, c0, tl.minimum(2 * BLOCK_N, Q_DIM + 2 * KV_DIM - c0), stride_wn,
            tl.program_id(1) * SPLIT_K + tl.program_id(2), tl.num_programs(1) * SPLIT_K, LANES,
        )  # fmt: skip
    wait_previous(PDL)
    if ROPE_TABLE and not EARLY_POSITIONS:  # written by the kernel before (pdl.py)
        rope_rows = tl.load(pos_ptr + rope_rows, mask=rope_rows < M, other=0)
    qkv_tile(
        tl.program_id(1), tl.program_id(0), tl.program_id(2), tile_counter(counter_ptr), x_ptr,
        norm_ptr, w_ptr, cos_ptr, sin_ptr, index_ptr, q_ptr, k_pool_ptr, v_pool_ptr, ws_ptr, M,
        K, split_len, stride_xm, stride_wn, stride_cos, stride_sin, stride_qm, stride_kpt,
        stride_kph, stride_vpt, stride_vph, eps, Q_DIM, KV_DIM, HEAD_DIM, NORM_CHUNKS, SPLIT_K,
        BLOCK_M, BLOCK_N, BLOCK_K, e0, e1, e2, e3, o0, o1, o2, o3, STAGED, rope_rows,
    )  # fmt: skip


def norm_qkv_rope(
    x: torch.Tensor,
    norm: torch.Tensor,
    qkv: torch.Tensor,
    eps: float,
    head_dim: int,
    q_dim: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    write_index: torch.Tensor,
    sm_count: int = 132,
    tiles: tuple | None = None,
    split_k: int | None = None,
    pdl: bool = False,
    prefetch: bool = True,
    stage: bool = False,
    positions: torch.Tensor | None = None,
    positions_staged: bool = True,
) -> torch.Tensor:
    """x [M, K]; norm [K]; qkv [q_dim + 2 kv_dim, K] (q, k, v rows); cos/sin [M, head_dim/2]
    (each row's position, unit column stride), or with `positions` [M] the whole tables
    [max_positions, head_dim/2] that the kernel reads each row's position of (no gathers
    before it); pools [slots, kv_heads, head_dim]; write_index [M] the cache slot of each row.
    Writes RoPE(k)
    and v into the pools and returns RoPE(q) as a new [M, q_dim]. `tiles` = (BLOCK_N pairs,
    BLOCK_K, warps, stages); `split_k` cuts the reduction into that many programs (default:
    `default_split_k`); `pdl`, `prefetch` and `stage` as in `few_row_linear`, but `stage` is off
    unless asked: staged pairs of tiles lose (staged_dot.py: where staging wins).
    `positions_staged`: the positions were written before the step's first kernel, so a PDL
    launch reads them before its wait; False (the kernel before wrote them): after it."""
    rows, k = x.shape
    kv_dim = (qkv.shape[0] - q_dim) // 2
    assert head_dim % 2 == 0 and q_dim % head_dim == 0 and kv_dim % head_dim == 0
    assert qkv.shape == (q_dim + 2 * kv_dim, k) and qkv.is_contiguous() and x.stride(-1) == 1
    assert k_pool.stride(-1) == 1 and v_pool.stride(-1) == 1
    assert cos.stride(-1) == 1 and sin.stride(-1) == 1
    q = torch.empty(rows, q_dim, device=x.device, dtype=qkv.dtype)
    pairs = (q_dim + 2 * kv_dim) // 2
    block_m, block_n, block_k, warps, stages = few_row_tiles(rows, pairs, sm_count, weight_tiles=2)
    if tiles is not None:
        block_n, block_k, warps, stages = tiles
    grid = (host_cdiv(pairs, block_n), host_cdiv(rows, block_m))
    split_k = splits_for(split_k, grid[0] * grid[1], k, block_k, sm_count)
    split_len = split_range(k, block_k, split_k)
    staged = 0
    if stage:
        staged = stage_chunks(block_m, block_n, block_k, warps, split_len, qkv.element_size(),
                              weight_tiles=2)  # fmt: skip
    if positions is not None:
        assert positions.shape == (rows,) and cos.shape[1] * 2 == head_dim
    _norm_qkv_rope_kernel[grid + (split_k,)](
        x, norm, qkv, cos, sin, write_index if positions is None else positions, write_index, q,
        k_pool, v_pool,
        split_workspace(split_k, rows, pairs, x.device, pairs=2),
        counters_for(x.device, grid[0] * grid[1]), rows, k, split_len,
        x.stride(0), qkv.stride(0), cos.stride(0), sin.stride(0),
        q.stride(0), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1), eps,
        Q_DIM=q_dim, KV_DIM=kv_dim, HEAD_DIM=head_dim, NORM_CHUNKS=norm_chunks(k, block_k),
        SPLIT_K=split_k,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PDL=pdl, PREFETCH=pdl and prefetch,
        LANES=32 * warps, STAGED=staged, ROPE_TABLE=positions is not None,
        EARLY_POSITIONS=positions_staged, num_warps=warps,
        num_stages=stages, **launch_options(pdl, x.device),
    )  # fmt: skip
    return q
