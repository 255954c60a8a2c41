"""Split-K flash-decoding that reads the paged (or slab) KV pool in place through the block table.

Wins at decode over gather + SDPA: no copy of the context, one launch per layer, and a fixed grid
valid for any kv_lens, so it can sit in a CUDA graph. The grid holds NUM_SPLITS splits a (row,
kv head), fixed at launch (at capture, for the graph's longest context); how many of them work
follows each row's live length on the device (at least `split_tokens` tokens a split), and the
last split to finish combines the partials (an arrival counter a (row, kv head), reset by that
split). Needs Triton >= 3.0 and an even head_dim <= 256; GQA groups ride as query rows of one
program per (row, kv head, split). How many splits, which tiles and what register cap each GPU
gets: `decode_attention_rules.py`."""

import math

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from variants.kernels.decode_attention_rules import (
    default_max_registers,
    default_parts,
    default_prefetch_tiles,
    default_tiles,
    long_split_programs,
    split_tokens_for,
)
from variants.kernels.device import device_capability, device_sm_count
from variants.kernels.pdl import launch_options, wait_previous
from variants.kernels.prefetch import prefetch_at

# The most partial values a combine holds at once ([splits, columns] float32): 64 registers a
# thread over two warps, whatever the split count (16 splits of a 256-wide part in one piece).
COMBINE_TILE = tl.constexpr(4096)


@triton.jit
def _combine_part(
    acc_ptr, row, s_mask, w, total, out_ptr, D0: tl.constexpr, BLOCK: tl.constexpr,
    ACC_D: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    """Columns D0..D0+BLOCK of the output, in chunks of columns that keep [splits, chunk]
    within COMBINE_TILE (each column's sum over the splits is the same whatever the chunk)."""
    chunk: tl.constexpr = BLOCK if BLOCK * BLOCK_S <= COMBINE_TILE else COMBINE_TILE // BLOCK_S
    for c in tl.static_range(BLOCK // chunk):
        offs_d = D0 + c * chunk + tl.arange(0, chunk)
        acc = tl.load(acc_ptr + row[:, None] * ACC_D + offs_d[None, :], mask=s_mask[:, None],
                      other=0.0, cache_modifier=".cg")  # fmt: skip
        o = tl.sum(acc * w[:, None], axis=0) / tl.where(total > 0, total, 1.0)
        tl.store(out_ptr + offs_d, o.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


@triton.jit
def _combine_head(
    m_ptr, l_ptr, acc_ptr, out_ptr, first_row, live, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_DA: tl.constexpr, BLOCK_DB: tl.constexpr,
):  # fmt: skip
    """One head's output from its `live` split partials. Empty splits hold m = -inf and get
    weight exp2(-inf) = 0. The loads skip L1 (.cg): other programs wrote these rows."""
    offs_s = tl.arange(0, BLOCK_S)
    s_mask = offs_s < live
    row = first_row + offs_s
    m = tl.load(m_ptr + row, mask=s_mask, other=float("-inf"), cache_modifier=".cg")
    l_s = tl.load(l_ptr + row, mask=s_mask, other=0.0, cache_modifier=".cg")
    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max > float("-inf"), m_max, 0.0)  # all empty: no -inf - -inf = NaN
    w = tl.exp2(m - m_max)
    total = tl.sum(l_s * w, axis=0)
    acc_d: tl.constexpr = BLOCK_DA + BLOCK_DB
    _combine_part(acc_ptr, row, s_mask, w, total, out_ptr, 0, BLOCK_DA, acc_d, HEAD_DIM,
                  BLOCK_S)  # fmt: skip
    if BLOCK_DB > 0:
        _combine_part(acc_ptr, row, s_mask, w, total, out_ptr, BLOCK_DA, BLOCK_DB, acc_d,
                      HEAD_DIM, BLOCK_S)  # fmt: skip


@triton.jit
def _rows_part(ptr, rows, stride_r, offset, r_mask, D0: tl.constexpr, BLOCK: tl.constexpr,
               HEAD_DIM: tl.constexpr):  # fmt: skip
    """Columns D0..D0+BLOCK of head_dim-long vectors at ptr + rows * stride_r + offset (masked
    past HEAD_DIM and where r_mask is off: zeros)."""
    offs_d = D0 + tl.arange(0, BLOCK)
    return tl.load(ptr + rows[:, None] * stride_r + offset + offs_d[None, :],
                   mask=r_mask[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0)  # fmt: skip


@triton.jit
def _scores(q, q_row, k, USE_DOT: tl.constexpr):
    """The group's scores against a tile of keys (one part of the head), float32 [G, N]."""
    if USE_DOT:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:  # a group of one: a dot product per key, no 16-row padding
        s = tl.sum(q_row[None, :] * k.to(tl.float32), axis=1)[None, :]
    return s


@triton.jit
def _weighted_values(p, v, USE_DOT: tl.constexpr):
    """p [G, N] (compute dtype) @ v [N, D part], float32."""
    if USE_DOT:
        pv = tl.dot(p, v, input_precision="ieee")
    else:
        p_row = tl.sum(p.to(tl.float32), axis=0)
        pv = tl.sum(p_row[:, None] * v.to(tl.float32), axis=0)[None, :]
    return pv


@triton.jit
def _store_split(acc, l_i, b, heads, g_mask, out_ptr, stride_ob, stride_oh, acc_ptr, row, live,
                 D0: tl.constexpr, BLOCK: tl.constexpr, ACC_D: tl.constexpr,
                 HEAD_DIM: tl.constexpr):  # fmt: skip
    """One part of the head: the output itself when one split works, else its partial."""
    offs_d = D0 + tl.arange(0, BLOCK)
    if live == 1:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # kv_len 0 (a padded row): zeros
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 o.to(out_ptr.dtype.element_ty),
                 mask=g_mask[:, None] & (offs_d < HEAD_DIM)[None, :])  # fmt: skip
    else:
        tl.store(acc_ptr + row[:, None] * ACC_D + offs_d[None, :], acc, mask=g_mask[:, None])


@triton.jit
def _token_slots(row_ptr, pos, mask, block_size, OFFSETS: tl.constexpr):
    """The pool slots of a row's positions `pos` through its table of block_size-token blocks:
    each entry a block's number, or (OFFSETS) its first token's slot."""
    if OFFSETS:
        return tl.load(row_ptr).to(tl.int64) + pos
    block = tl.load(row_ptr + pos // block_size, mask=mask, other=0)
    return block.to(tl.int64) * block_size + pos % block_size


@triton.jit
def attend_split(
    b, kvh, split, kv_heads, q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, m_ptr, l_ptr,
    acc_ptr, arrivals_ptr, stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_tb, stride_ob, stride_oh, block_size, split_tokens, qk_scale_log2,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DA: tl.constexpr,
    BLOCK_DB: tl.constexpr, USE_DOT: tl.constexpr, OFFSETS: tl.constexpr,
):  # fmt: skip
    """Split `split` of row b's kv head `kvh` (of `kv_heads`): its partial, and the combine
    when it is the last live split of that (row, kv head) to finish. The head runs as one
    power-of-two part BLOCK_DA (masked past HEAD_DIM) or as two, BLOCK_DA + BLOCK_DB
    (`default_parts`: 192 = 128 + 64, no padding held in registers)."""
    num_heads = kv_heads * GROUP
    acc_d: tl.constexpr = BLOCK_DA + BLOCK_DB
    kv_len = tl.load(lens_ptr + b).to(tl.int32)
    # q does not depend on the length: its load is issued beside it, not after.
    offs_g = tl.arange(0, BLOCK_G)
    offs_n = tl.arange(0, BLOCK_N)
    heads = kvh * GROUP + offs_g
    g_mask = offs_g < GROUP
    q_off = b * stride_qb
    q_a = _rows_part(q_ptr, heads, stride_qh, q_off, g_mask, 0, BLOCK_DA, HEAD_DIM)
    if BLOCK_DB > 0:
        q_b = _rows_part(q_ptr, heads, stride_qh, q_off, g_mask, BLOCK_DA, BLOCK_DB, HEAD_DIM)
    # Splits that work: one per split_tokens of live context, at least one, at most the grid's.
    live = tl.minimum(tl.maximum(tl.cdiv(kv_len, split_tokens), 1), NUM_SPLITS)
    if split < live:
        split_len = tl.cdiv(tl.cdiv(kv_len, live), BLOCK_N) * BLOCK_N
        start = split * split_len
        end = tl.minimum(start + split_len, kv_len)

        # the query when GROUP == 1 (a sum over one row)
        q_row_a = tl.sum(q_a.to(tl.float32), axis=0)
        if BLOCK_DB > 0:
            q_row_b = tl.sum(q_b.to(tl.float32), axis=0)
        # input_precision="ieee" only matters for float32 pools (no TF32); fp16/bf16 unaffected.

        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc_a = tl.zeros([BLOCK_G, BLOCK_DA], tl.float32)
        if BLOCK_DB > 0:
            acc_b = tl.zeros([BLOCK_G, BLOCK_DB], tl.float32)
        for n0 in range(start, end, BLOCK_N):
            pos = n0 + offs_n
            n_mask = pos < end
            slot = _token_slots(table_ptr + b * stride_tb, pos, n_mask, block_size, OFFSETS)
            k_off, v_off = kvh * stride_kh, kvh * stride_vh
            k_a = _rows_part(k_ptr, slot, stride_kt, k_off, n_mask, 0, BLOCK_DA, HEAD_DIM)
            v_a = _rows_part(v_ptr, slot, stride_vt, v_off, n_mask, 0, BLOCK_DA, HEAD_DIM)
            s = _scores(q_a, q_row_a, k_a, USE_DOT)
            if BLOCK_DB > 0:
                k_b = _rows_part(k_ptr, slot, stride_kt, k_off, n_mask, BLOCK_DA, BLOCK_DB,
                                 HEAD_DIM)  # fmt: skip
                v_b = _rows_part(v_ptr, slot, stride_vt, v_off, n_mask, BLOCK_DA, BLOCK_DB,
                                 HEAD_DIM)  # fmt: skip
                s += _scores(q_b, q_row_b, k_b, USE_DOT)
            s = tl.where(n_mask[None, :], s * qk_scale_log2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: the block holds a live position
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            p = p.to(v_a.dtype)  # the reference casts probabilities to the compute dtype before @ V
            acc_a = acc_a * alpha[:, None] + _weighted_values(p, v_a, USE_DOT)
            if BLOCK_DB > 0:
                acc_b = acc_b * alpha[:, None] + _weighted_values(p, v_b, USE_DOT)
            m_i = m_new

        # partials [B, heads, splits] (+ [DA + DB]); an empty split stores m=-inf, l=0, acc=0
        row = (b * num_heads + heads) * NUM_SPLITS + split
        _store_split(acc_a, l_i, b, heads, g_mask, out_ptr, stride_ob, stride_oh, acc_ptr, row,
                     live, 0, BLOCK_DA, acc_d, HEAD_DIM)  # fmt: skip
        if BLOCK_DB > 0:
            _store_split(acc_b, l_i, b, heads, g_mask, out_ptr, stride_ob, stride_oh, acc_ptr,
                         row, live, BLOCK_DA, BLOCK_DB, acc_d, HEAD_DIM)  # fmt: skip
        if live > 1:
            tl.store(m_ptr + row, m_i, mask=g_mask)
            tl.store(l_ptr + row, l_i, mask=g_mask)
            # Every thread's stores land before the arrival (a block barrier, then a release at
            # GPU scope); the last to arrive acquires them all, combines and resets the counter.
            tl.debug_barrier()
            counter = arrivals_ptr + b * kv_heads + kvh
            if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == live - 1:
                tl.debug_barrier()
                for g in tl.static_range(GROUP):
                    head = kvh * GROUP + g
                    _combine_head(
                        m_ptr, l_ptr, acc_ptr, out_ptr + b * stride_ob + head * stride_oh,
                        (b * num_heads + head) * NUM_SPLITS, live, HEAD_DIM, BLOCK_S,
                        BLOCK_DA, BLOCK_DB,
                    )  # fmt: skip
                tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")


@triton.jit
def _prefetch_split(
    b, kvh, split, k_ptr, v_ptr, table_ptr, lens_ptr, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_tb, block_size, split_tokens, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_N: tl.constexpr, TILES: tl.constexpr, OFFSETS: tl.constexpr,
):  # fmt: skip
    """Prefetch into L2 the keys and values of the first TILES tiles split `split` of row b's
    kv head will read, before the PDL wait (at 8 x 150 a split is one tile; the cap keeps long
    contexts from asking for more than L2 holds), in one gather of the block table and one
    round of prefetches. The lengths and the block table are staged before the step's first
    kernel, so they are complete here (pdl.py); the newest key may still be being written,
    which a prefetch, a hint, cannot get wrong."""
    kv_len = tl.load(lens_ptr + b).to(tl.int32)
    live = tl.minimum(tl.maximum(tl.cdiv(kv_len, split_tokens), 1), NUM_SPLITS)
    if split < live:
        split_len = tl.cdiv(tl.cdiv(kv_len, live), BLOCK_N) * BLOCK_N
        start = split * split_len
        end = tl.minimum(start + split_len, kv_len)
        lines: tl.constexpr = triton.next_power_of_2(
            triton.cdiv(HEAD_DIM * k_ptr.dtype.element_ty.primitive_bitwidth, 1024)
        )
        per_line: tl.constexpr = 1024 // k_ptr.dtype.element_ty.primitive_bitwidth
        offs_d = tl.minimum(tl.arange(0, lines) * per_line, HEAD_DIM - 1)  # a row's lines
        # past the split's end: its last position again
        pos = tl.minimum(start + tl.arange(0, TILES * BLOCK_N), end - 1)
        block = tl.load(table_ptr + b * stride_tb + pos // block_size)
        if OFFSETS:
            slot = (block + pos % block_size).to(tl.int64)
        else:
            slot = block.to(tl.int64) * block_size + pos % block_size
        prefetch_at(k_ptr + slot[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :])
        prefetch_at(v_ptr + slot[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :])


@triton.jit
def _grid_split_tokens(lens_ptr, split_tokens, min_programs, batch, kv_heads,
                       BLOCK_B: tl.constexpr):  # fmt: skip
    """The fewest tokens a split gets in this launch: split_tokens doubled, up to twice, while
    the (row, kv head, split) programs that work still number at least min_programs, counted
    over every row's live length (padding rows have none). Every program reads the same
    lengths, so all agree."""
    rows = tl.arange(0, BLOCK_B)
    lens = tl.load(lens_ptr + rows, mask=rows < batch, other=0).to(tl.int32)
    # more tokens a split means fewer programs: "four" implies "two"
    two = kv_heads * tl.sum(tl.cdiv(lens, 2 * split_tokens), axis=0) >= min_programs
    four = kv_heads * tl.sum(tl.cdiv(lens, 4 * split_tokens), axis=0) >= min_programs
    return split_tokens * (1 + two.to(tl.int32) + 2 * four.to(tl.int32))


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, arrivals_ptr,
    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_tb,
    stride_ob, stride_oh, block_size, split_tokens, min_programs, qk_scale_log2,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DA: tl.constexpr,
    BLOCK_DB: tl.constexpr, USE_DOT: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr,
    LONG_SPLITS: tl.constexpr, BLOCK_B: tl.constexpr, OFFSETS: tl.constexpr,
):  # fmt: skip
    if LONG_SPLITS:  # before a PDL wait too: the lengths are staged before the step (pdl.py)
        split_tokens = _grid_split_tokens(
            lens_ptr, split_tokens, min_programs, tl.num_programs(0), tl.num_programs(1), BLOCK_B
        )
    if PREFETCH > 0:  # the tiles a split prefetches
        _prefetch_split(
            tl.program_id(0), tl.program_id(1), tl.program_id(2), k_ptr, v_ptr, table_ptr,
            lens_ptr, stride_kt, stride_kh, stride_vt, stride_vh, stride_tb, block_size,
            split_tokens, HEAD_DIM, NUM_SPLITS, BLOCK_N, PREFETCH, OFFSETS,
        )  # fmt: skip
    wait_previous(PDL)  # q (and this step's key) come from the kernel before
    attend_split(
        tl.program_id(0), tl.program_id(1), tl.program_id(2), tl.num_programs(1), q_ptr, k_ptr,
        v_ptr, table_ptr, lens_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, arrivals_ptr, stride_qb,
        stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_tb, stride_ob, stride_oh,
        block_size, split_tokens, qk_scale_log2, GROUP, HEAD_DIM, NUM_SPLITS, BLOCK_S, BLOCK_G,
        BLOCK_N, BLOCK_DA, BLOCK_DB, USE_DOT, OFFSETS,
    )  # fmt: skip


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
    arrivals: torch.Tensor | None = None,
    split_tokens: int | None = None,
    pdl: bool = False,
    prefetch: bool = True,
    parts: tuple | None = None,
    min_programs: int | None = None,
    max_registers: int | None = None,
    prefetch_tiles: int | None = None,
    offsets: bool = False,
) -> torch.Tensor:
    """q [B, heads, d]; pools [slots, kv_heads, d]; block_table [B, W] (int32 or int64) of
    block_size-token blocks, or with `offsets` [B, 1]: each row's first token slot (a slab's:
    its slots can change length in place, and a graph holds no length); kv_lens [B] (a row of
    length 0 gets zeros). Returns
    [B, heads, d] in q's dtype (into `out` when given). `num_splits` is the most splits a row
    gets; each live split gets at least `split_tokens` tokens (default: `split_tokens_for` the
    tile). `arrivals`: int32 zeros, at least
    B x kv_heads, that the kernel leaves zero (a CUDA graph keeps one; allocated when None).
    `tiles` = (BLOCK_N, num_warps, num_stages) overrides the defaults
    (experiments/tune_decode_attention.py). `pdl`: launched with programmatic dependent launch
    (pdl.py), the first `prefetch_tiles` tiles (a power of two; None:
    `default_prefetch_tiles`) of each split's keys and values prefetched into L2 before the
    wait unless `prefetch` is False. `parts` = (DA, DB) overrides how the head
    is cut (`default_parts`).
    `min_programs` > 0 lets splits grow to 2x or 4x `split_tokens` while that many (row, kv
    head, split) programs still work (`long_split_programs`; 0: never). `max_registers` caps
    ptxas's registers a thread (None: `default_max_registers` of the tiles; 0: no cap)."""
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
    num_splits = max(1, int(num_splits))
    defaults = (tiles, parts, min_programs, max_registers, prefetch_tiles)
    if any(x is None for x in defaults):
        sms, capability = device_sm_count(q.device), device_capability(q.device)
        if prefetch_tiles is None:
            prefetch_tiles = default_prefetch_tiles(batch, kv_heads, num_splits, capability)
        if min_programs is None:  # measured with the default tiles and splits only
            given = tiles is not None or split_tokens is not None
            min_programs = 0 if given else long_split_programs(batch, kv_heads, sms, capability)
        tiles = tiles or default_tiles(batch, kv_heads, block_d, sms, capability, num_splits)
        parts = parts or default_parts(d, batch, kv_heads, sms, capability)
        if max_registers is None:
            max_registers = default_max_registers(
                tiles, batch, kv_heads, num_splits, sms, capability
            )
    da, db = parts
    assert prefetch_tiles >= 0 and prefetch_tiles & (prefetch_tiles - 1) == 0, (
        f"prefetch_tiles {prefetch_tiles} must be 0 or a power of two"
    )
    assert da >= 16 and (db == 0 or db >= 16) and da + db >= d, f"{parts} for head_dim {d}"
    if split_tokens is None:
        split_tokens = split_tokens_for(tiles[0])
    if arrivals is None:  # the kernel compiles its counter code even when one split never uses it
        arrivals = torch.zeros(batch * kv_heads, device=q.device, dtype=torch.int32)
    assert arrivals.dtype == torch.int32 and arrivals.numel() >= batch * kv_heads
    if num_splits > 1:
        m = torch.empty(batch, heads, num_splits, device=q.device, dtype=torch.float32)
        l_s = torch.empty_like(m)
        acc = torch.empty(batch, heads, num_splits, da + db, device=q.device, dtype=torch.float32)
    else:
        m = l_s = acc = out  # unused: one split writes the output directly
    args = (
        q, k_pool, v_pool, block_table, kv_lens, out, m, l_s, acc, arrivals,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), v_pool.stride(0),
        v_pool.stride(1), block_table.stride(0), out.stride(0), out.stride(1), block_size,
        max(1, int(split_tokens)), max(0, int(min_programs)), scale * math.log2(math.e),
    )  # fmt: skip
    meta = dict(
        GROUP=group, HEAD_DIM=d, NUM_SPLITS=num_splits, BLOCK_S=triton.next_power_of_2(num_splits),
        BLOCK_G=block_g, BLOCK_DA=da, BLOCK_DB=db, USE_DOT=use_dot, PDL=pdl,
        PREFETCH=prefetch_tiles if pdl and prefetch else 0,
        LONG_SPLITS=min_programs > 0, OFFSETS=offsets,
        BLOCK_B=triton.next_power_of_2(batch) if min_programs > 0 else 1,
        **launch_options(pdl, q.device),
    )  # fmt: skip
    if max_registers and q.is_cuda:
        meta.update(
            register_cap(int(max_registers), (batch, kv_heads, num_splits), args, meta, tiles)
        )
    key = (q.device, tiles, parts, block_g)
    if key in _TOO_BIG:  # this GPU refused the tile before: the small one, without retrying
        tiles = (32, 4, 2)
    try:
        _launch((batch, kv_heads, num_splits), args, meta, tiles)
    except OutOfResources:  # raised before anything runs (e.g. a 99 KiB RTX 3090 block)
        if tiles == (32, 4, 2):
            raise
        _TOO_BIG.add(key)
        _launch((batch, kv_heads, num_splits), args, meta, (32, 4, 2))
    return out


_TOO_BIG: set = set()
# registers a thread ptxas takes alone, per build (`register_cap`)
_OWN_REGISTERS: dict = {}


def register_cap(cap: int, grid: tuple, args: tuple, meta: dict, tiles: tuple) -> dict:
    """{"maxnreg": cap} where ptxas alone takes fewer registers for this build, else {}: a cap
    never forces a build below its own count, which another Triton or GPU may put above the
    cap (capped there, it would spill). Compiles the build without the cap once (cached) to
    read its count."""
    block_n, warps, stages = tiles
    signature = tuple(a.dtype if isinstance(a, torch.Tensor) else a for a in args)
    key = (args[0].device, tiles, tuple(sorted(meta.items())), signature)
    if key not in _OWN_REGISTERS:
        build = _decode_split_kernel.warmup(
            *args, grid=grid, **meta, BLOCK_N=block_n, num_warps=warps, num_stages=stages
        )
        build._init_handles()
        _OWN_REGISTERS[key] = build.n_regs
    return {"maxnreg": cap} if _OWN_REGISTERS[key] < cap else {}


def _launch(grid: tuple, args: tuple, meta: dict, tiles: tuple) -> None:
    block_n, warps, stages = tiles
    _decode_split_kernel[grid](*args, **meta, BLOCK_N=block_n, num_warps=warps, num_stages=stages)
