"""Varlen causal prefill attention (flash-attention style) over packed prompts, no padding.

Wins over padded SDPA on ragged prompt batches (no pad/unpad copies, no work on padding) and
where SDPA's flash kernel lacks the head_dim. Needs Triton >= 3.0 and an even head_dim <= 256,
held in two power-of-two parts (192 = 128 + 64; the second padded with masks where needed);
GQA by index, K/V are never expanded."""

import array
import math

import torch
import triton
import triton.language as tl

from variants.kernels.device import device_capability
from variants.staging import int_fill


@triton.jit
def scheduled_block(cu_ptr, sched_ptr, n_sched, SCHEDULED: tl.constexpr):
    """This program's (prompt start, prompt length, q-block index); the head is program_id(0),
    so the heads of one q-block launch side by side. A fixed grid (CUDA graphs) reads (prompt,
    q-block) from its table, longest work first (`prefill_schedule`); a program beyond the
    call's q-blocks gets length 0. Otherwise the grid is (heads, prompts, q-blocks of the
    longest prompt), the last q-block first: under the causal mask a block's work grows with
    its index, and the GPU starts programs in grid order, so the short blocks fill in behind
    the long ones instead of a long one starting last."""
    if SCHEDULED:
        b = tl.load(sched_ptr + tl.program_id(1)).to(tl.int32)
        m_block = tl.load(sched_ptr + n_sched + tl.program_id(1)).to(tl.int32)
    else:
        m_block = tl.num_programs(2) - 1 - tl.program_id(2)
        b = tl.program_id(1)
    live = b >= 0
    b = tl.maximum(b, 0)
    seq_start = tl.load(cu_ptr + b).to(tl.int32)
    seq_len = tl.where(live, tl.load(cu_ptr + b + 1).to(tl.int32) - seq_start, 0)
    return seq_start, seq_len, m_block


@triton.jit
def softmax_weights(s, pos, offs_m, n_mask, m_i, l_i, MASKED: tl.constexpr):
    """One key tile of flash attention: the causal mask (MASKED: a tile on the diagonal or past
    the prompt; the others are visible whole), the running max and sum. Returns the tile's
    probabilities (unnormalised), the factor that rescales the output so far, and the new max
    and sum. `s` holds scores times log2(e) / sqrt(d), in float32."""
    if MASKED:
        # Key 0 is visible to every row, so no row is all -inf and the update never sees NaN.
        visible = (pos[None, :] <= offs_m[:, None]) & n_mask[None, :]
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def head_part(ptr, rows, stride_t, head_offset, row_mask, FIRST: tl.constexpr,
              WIDTH: tl.constexpr, HEAD_DIM: tl.constexpr):  # fmt: skip
    """Dimensions [FIRST, FIRST + WIDTH) of one head for `rows`, zero past HEAD_DIM."""
    offs = FIRST + tl.arange(0, WIDTH)
    mask = row_mask[:, None] & (offs < HEAD_DIM)[None, :]
    return tl.load(ptr + rows[:, None] * stride_t + head_offset + offs[None, :], mask=mask,
                   other=0.0)  # fmt: skip


@triton.jit
def key_part(ptr, rows, stride_t, head_offset, row_mask, FIRST: tl.constexpr,
             WIDTH: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """`head_part` of a key tile; unmasked (every row live), without any mask where the part
    lies within HEAD_DIM."""
    if MASKED or FIRST + WIDTH > HEAD_DIM:
        return head_part(ptr, rows, stride_t, head_offset, row_mask, FIRST, WIDTH, HEAD_DIM)
    offs = FIRST + tl.arange(0, WIDTH)
    return tl.load(ptr + rows[:, None] * stride_t + head_offset + offs[None, :])


@triton.jit
def _store_part(o_ptr, part, rows, stride_ot, head_offset, row_mask, FIRST: tl.constexpr,
                WIDTH: tl.constexpr, HEAD_DIM: tl.constexpr):  # fmt: skip
    offs = FIRST + tl.arange(0, WIDTH)
    mask = row_mask[:, None] & (offs < HEAD_DIM)[None, :]
    tl.store(o_ptr + rows[:, None] * stride_ot + head_offset + offs[None, :],
             part.to(o_ptr.dtype.element_ty), mask=mask)  # fmt: skip


@triton.jit
def _key_tile(q_a, q_b, acc_a, acc_b, m_i, l_i, k_ptr, v_ptr, seq_start, k_off, v_off,
              stride_kt, stride_vt, n0, end, offs_n, offs_m, qk_scale_log2,
              HEAD_DIM: tl.constexpr, BLOCK_DA: tl.constexpr, BLOCK_DB: tl.constexpr,
              MASKED: tl.constexpr):  # fmt: skip
    """Keys n0..n0+BLOCK_N of the prompt into the running output (both parts of the head).
    (Scalars one by one: Triton 3.0 passes no tuples to a jit function.)"""
    pos = n0 + offs_n
    n_mask = pos < end
    keys = seq_start + pos
    k_a = key_part(k_ptr, keys, stride_kt, k_off, n_mask, 0, BLOCK_DA, HEAD_DIM, MASKED)
    v_a = key_part(v_ptr, keys, stride_vt, v_off, n_mask, 0, BLOCK_DA, HEAD_DIM, MASKED)
    s = tl.dot(q_a, tl.trans(k_a), input_precision="ieee")
    if BLOCK_DB > 0:
        k_b = key_part(k_ptr, keys, stride_kt, k_off, n_mask, BLOCK_DA, BLOCK_DB, HEAD_DIM,
                       MASKED)  # fmt: skip
        v_b = key_part(v_ptr, keys, stride_vt, v_off, n_mask, BLOCK_DA, BLOCK_DB, HEAD_DIM,
                       MASKED)  # fmt: skip
        s = tl.dot(q_b, tl.trans(k_b), s, input_precision="ieee")
    p, alpha, m_i, l_i = softmax_weights(s * qk_scale_log2, pos, offs_m, n_mask, m_i, l_i, MASKED)
    p = p.to(v_a.dtype)
    acc_a = acc_a * alpha[:, None] + tl.dot(p, v_a, input_precision="ieee")
    if BLOCK_DB > 0:
        acc_b = acc_b * alpha[:, None] + tl.dot(p, v_b, input_precision="ieee")
    return acc_a, acc_b, m_i, l_i


@triton.jit
def _varlen_prefill_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, cu_ptr, sched_ptr, n_sched,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    qk_scale_log2,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_DA: tl.constexpr, BLOCK_DB: tl.constexpr, SCHEDULED: tl.constexpr,
):  # fmt: skip
    # A head's dimensions in two power-of-two parts, [0, DA) and [DA, DA + DB) (DB = 0: one):
    # 192 is 128 + 64, with no padding to 256 to hold in registers and multiply.
    h = tl.program_id(0)
    seq_start, seq_len, m_block = scheduled_block(cu_ptr, sched_ptr, n_sched, SCHEDULED)
    if m_block * BLOCK_M >= seq_len:  # the grid covers the longest prompt
        return
    kvh = h // GROUP

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    m_mask = offs_m < seq_len
    rows = seq_start + offs_m  # int32 offsets: fewer registers than int64 (the launcher checks)
    q_a = head_part(q_ptr, rows, stride_qt, h * stride_qh, m_mask, 0, BLOCK_DA, HEAD_DIM)
    if BLOCK_DB > 0:
        q_b = head_part(q_ptr, rows, stride_qt, h * stride_qh, m_mask, BLOCK_DA, BLOCK_DB,
                        HEAD_DIM)  # fmt: skip
        acc_b = tl.zeros([BLOCK_M, BLOCK_DB], tl.float32)
    else:  # one part: never read, and the loops carry it unchanged (the compiler drops it)
        q_b = q_a
        acc_b = tl.zeros([BLOCK_M, 16], tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc_a = tl.zeros([BLOCK_M, BLOCK_DA], tl.float32)
    # Key tiles before the block's first row are visible to every row: no mask to build or
    # apply. The rest, up to the block's last row (causal), are masked. A q-block shorter than
    # a key tile keeps one loop: its whole tiles are few, and a second loop's pipeline start
    # costs more than their masks (measured at 4 x 128 prompts over 16 x 64 tiles).
    end = tl.minimum((m_block + 1) * BLOCK_M, seq_len)
    k_off, v_off = kvh * stride_kh, kvh * stride_vh
    first_masked = 0
    if BLOCK_M >= BLOCK_N:
        first_masked = (m_block * BLOCK_M) // BLOCK_N * BLOCK_N
        for n0 in range(0, first_masked, BLOCK_N):
            acc_a, acc_b, m_i, l_i = _key_tile(
                q_a, q_b, acc_a, acc_b, m_i, l_i, k_ptr, v_ptr, seq_start, k_off, v_off,
                stride_kt, stride_vt, n0, end, offs_n, offs_m, qk_scale_log2, HEAD_DIM,
                BLOCK_DA, BLOCK_DB, False,
            )  # fmt: skip
    for n0 in range(first_masked, end, BLOCK_N):
        acc_a, acc_b, m_i, l_i = _key_tile(
            q_a, q_b, acc_a, acc_b, m_i, l_i, k_ptr, v_ptr, seq_start, k_off, v_off,
            stride_kt, stride_vt, n0, end, offs_n, offs_m, qk_scale_log2, HEAD_DIM, BLOCK_DA,
            BLOCK_DB, True,
        )  # fmt: skip

    o_off = h * stride_oh
    _store_part(o_ptr, acc_a / l_i[:, None], rows, stride_ot, o_off, m_mask, 0, BLOCK_DA,
                HEAD_DIM)  # fmt: skip
    if BLOCK_DB > 0:
        _store_part(o_ptr, acc_b / l_i[:, None], rows, stride_ot, o_off, m_mask, BLOCK_DA,
                    BLOCK_DB, HEAD_DIM)  # fmt: skip


def head_parts(head_dim: int) -> tuple:
    """(DA, DB): a head_dim as a power of two and the rest padded to one (0 when none), each at
    least 16 (tl.dot's smallest): 192 -> (128, 64), 128 -> (128, 0), 24 -> (16, 16)."""
    if head_dim <= 16:
        return 16, 0
    first = 1 << (head_dim.bit_length() - 1)
    rest = head_dim - first
    return first, (max(16, triton.next_power_of_2(rest)) if rest else 0)


def prefill_stages(capability: tuple = (0, 0)) -> int:
    """Software-pipeline stages of the key tiles: three on Hopper, faster than two from 1024
    tokens (a tie at the 16-row q-blocks), two elsewhere (unmeasured there; the RTX 3090's
    99 KB of shared memory)."""
    return 3 if tuple(capability) >= (9, 0) else 2


SHORT_TOKENS = 512  # up to this many packed tokens, 16-row q-blocks (Hopper: `prefill_tiles`)
WIDE_TOKENS = 4096  # past this many, 128-row q-blocks at head_dim > 128 (Hopper)


def prefill_tiles(head_dim: int, capability: tuple = (0, 0), tokens: int | None = None) -> tuple:
    """(BLOCK_M, BLOCK_N, num_warps) for a head_dim on a GPU of that compute capability, for a
    call of `tokens` packed tokens (None: a long call).
    The pre-Hopper tiles compile for sm_86 with Triton 3.0 without register spills (ptxas -v)
    and within the RTX 3090's 99 KB of shared memory (28 KB at d=192); nothing else was
    measured there. Hopper (sm_90 and newer, 228 KB a block) picks by the call's size, from
    CUDA-graph sweeps (experiments/tune_prefill_attention.py --graph): a short call has
    too few q-blocks to fill the GPU, and 16-row blocks are fastest (well ahead of 128-row
    blocks at 4 x 128); up to 4096 tokens 64 x 64 over 4 warps; past that, at d > 128,
    128 x 64 over 8 warps. The prefill graphs build each bucket's q-block schedule with this
    call for the bucket's token count."""
    wide = head_dim > 128
    if tuple(capability) >= (9, 0):
        if tokens is not None and tokens <= SHORT_TOKENS:
            return 16, 64, 4
        if not wide or (tokens is not None and tokens <= WIDE_TOKENS):
            return 64, 64, 4
        return 128, 64, 8
    if head_dim <= 64:
        return 64, 64, 4
    return (32, 32, 8) if wide else (64, 32, 8)


def prefill_schedule(lengths: list, block_m: int, size: int) -> array.array:
    """The [2, size] table of a scheduled launch, flattened into an int64 array: row 0 the
    prompt of each q-block (-1 past the last), row 1 the block's index within its prompt. The
    q-blocks come by index, highest first (the most keys under the causal mask), prompts in
    order within an index: the longest work starts first (`scheduled_block`)."""
    prompts, blocks = array.array("q"), array.array("q")
    counts = [-(-n // block_m) for n in lengths]  # (triton.cdiv goes through the JIT: slow)
    for index in range(max(counts, default=0) - 1, -1, -1):
        having = array.array("q", [b for b, count in enumerate(counts) if count > index])
        prompts += having
        blocks += int_fill(index, len(having))
    if len(prompts) > size:
        raise ValueError(f"{len(prompts)} q-blocks exceed the schedule's {size}")
    pad = size - len(prompts)
    return prompts + int_fill(-1, pad) + blocks + int_fill(0, pad)


def varlen_prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float,
    schedule: torch.Tensor | None = None,
    tiles: tuple | None = None,
) -> torch.Tensor:
    """q [N, heads, d], k/v [N, kv_heads, d] packed prompts (views with unit last stride are
    fine); cu_seqlens [B+1] int32 prefix sums of the lengths. Returns [N, heads, d].
    `schedule` ([2, S] from `prefill_schedule`, on the device) fixes the grid at S programs per
    head whatever the lengths, as a CUDA graph needs; max_seqlen is then unused. The tiles
    follow the packed token count (`prefill_tiles`): a graph's schedule is built for its
    bucket. `tiles` = (BLOCK_M, BLOCK_N, warps, stages) overrides `prefill_tiles` and
    `prefill_stages` (a table of the autotuner's kernel search): a schedule must then be built
    for its BLOCK_M, as the prefill graphs build a bucket's from the table."""
    tokens, heads, d = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    assert heads == group * kv_heads and d % 2 == 0 and d <= 256, (heads, kv_heads, d)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out = torch.empty(tokens, heads, d, device=q.device, dtype=q.dtype)
    assert tokens * max(q.stride(0), k.stride(0), v.stride(0)) < 2**31, "int32 row offsets"
    capability = device_capability(q.device)
    block_m, block_n, warps = prefill_tiles(d, capability, tokens)
    parts, stages = head_parts(d), prefill_stages(capability)
    if tiles is not None:
        block_m, block_n, warps, stages = tiles
    if schedule is None:
        grid = (heads, cu_seqlens.numel() - 1, triton.cdiv(max_seqlen, block_m))
        sched, n_sched = cu_seqlens, 0
    else:
        grid = (heads, schedule.shape[1], 1)
        sched, n_sched = schedule, schedule.shape[1]
    _varlen_prefill_kernel[grid](
        q, k, v, out, cu_seqlens, sched, n_sched,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), scale * math.log2(math.e),
        GROUP=group, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_DA=parts[0],
        BLOCK_DB=parts[1], SCHEDULED=schedule is not None, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out
