"""A whole decoder layer of a decode step (up to 16 rows) in one persistent launch: the five
phases of the fused layers (norm + QKV + RoPE + cache write, split-K attention, the output
projection with the residual add, norm + gate-up + SiLU-mul, the down projection with the
residual add) run one after another by one program an SM, with a grid barrier between phases.

At 8 rows a phase reads 1-9 MB of weights, a few microseconds of HBM traffic, yet each was a
kernel of its own costs 3.5 us or more. Here a barrier replaces
each kernel boundary. Each phase's programs walk the phase's work items (output tiles,
attention splits) in strides of the grid, and the tile code is the fused kernels' own
(`qkv_tile`, `attend_split`, `linear_tile`, `swiglu_tile`), so rounding is theirs. After the
first phase the programs prefetch the later phases' weights and the next kernel's first into L2
(prefetch.py), where L2 holds a layer.

On the H200 it ties with the fused layers' five kernels in a graph of 12 layers (about 31 us a
layer; scripts/bench_decode_layer.py) and is a few percent slower in a whole decode step: a
barrier costs about what a kernel boundary does (1 us), and one program an SM hides less latency
than the separate kernels do.

The residual goes x -> xb (after the attention) -> x (after the MLP): no phase reads a buffer
that another program of the same launch rewrote after this program had read it. Under Triton's
interpreter, which runs programs one after another and so cannot wait at a barrier, the
launcher runs one phase a launch instead (FIRST == LAST)."""

import functools
import math

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from variants.kernels.decode_attention import attend_split
from variants.kernels.decode_attention_rules import SPLIT_TOKENS, default_tiles
from variants.kernels.device import device_capability
from variants.kernels.few_row_linear import linear_tile
from variants.kernels.grid_barrier import grid_barrier, leave
from variants.kernels.norm_qkv_rope import qkv_tile
from variants.kernels.norm_swiglu import swiglu_tile
from variants.kernels.prefetch import l2_holds, prefetch_l2
from variants.kernels.row_dot import few_row_tiles
from variants.kernels.split_k import LONG_K_TILES, counters_for, host_cdiv, split_range

MAX_ROWS = 16  # one row tile (tl.dot's 16-row minimum)
PHASES = 5


@triton.jit
def _phase_barrier(barrier_ptr, after: tl.constexpr, FIRST: tl.constexpr, LAST: tl.constexpr):
    """The barrier between phase `after` and the next, when this launch runs both."""
    if FIRST <= after and after < LAST:
        grid_barrier(barrier_ptr, after - FIRST + 1)


@triton.jit
def _decode_layer_kernel(
    x_ptr, xb_ptr, cos_ptr, sin_ptr, index_ptr, table_ptr, lens_ptr,
    in_norm_ptr, qkv_ptr, o_w_ptr, post_norm_ptr, gu_ptr, down_ptr, k_pool_ptr, v_pool_ptr,
    q_ptr, attn_ptr, m_ptr, l_ptr, acc_ptr, arrivals_ptr, act_ptr, ws_ptr, counters_ptr,
    barrier_ptr, next_ptr, next_bytes, M, down_split_len, block_size, split_tokens,
    qk_scale_log2, eps, stride_cos, stride_sin, stride_kpt, stride_kph, stride_vpt, stride_vph,
    stride_tb,
    H: tl.constexpr, INTER: tl.constexpr, Q_DIM: tl.constexpr, KV_DIM: tl.constexpr,
    HEAD_DIM: tl.constexpr, GROUP: tl.constexpr, KV_HEADS: tl.constexpr,
    NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_DA: tl.constexpr, BLOCK_DB: tl.constexpr, ATT_N: tl.constexpr, USE_DOT: tl.constexpr,
    QKV_N: tl.constexpr, QKV_K: tl.constexpr, O_N: tl.constexpr, O_K: tl.constexpr,
    GU_N: tl.constexpr, GU_K: tl.constexpr, DN_N: tl.constexpr, DN_K: tl.constexpr,
    DN_SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, FIRST: tl.constexpr, LAST: tl.constexpr,
    PREFETCH: tl.constexpr, W_BYTES: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    # (the tiles' trailing zeros: nothing staged, staged_dot.py)
    if FIRST <= 1 and 1 <= LAST:  # norm + QKV + RoPE, k and v into the cache
        for t in range(pid, tl.cdiv((Q_DIM + 2 * KV_DIM) // 2, QKV_N), grid):
            qkv_tile(
                0, t, 0, counters_ptr, x_ptr, in_norm_ptr, qkv_ptr, cos_ptr, sin_ptr, index_ptr,
                q_ptr, k_pool_ptr, v_pool_ptr, ws_ptr, M, H, H, H, H, stride_cos, stride_sin,
                Q_DIM, stride_kpt, stride_kph, stride_vpt, stride_vph, eps, Q_DIM, KV_DIM,
                HEAD_DIM, (H + QKV_K - 1) // QKV_K, 1, BLOCK_M, QKV_N, QKV_K, 0, 0, 0, 0, 0, 0, 0,
                0, 0, tl.arange(0, BLOCK_M),
            )  # fmt: skip
    # The later phases' weights, and the next kernel's first (next_ptr), into L2 while the
    # attention leaves HBM idle. After the QKV phase: issued before it, they queue ahead of its
    # loads and the phase takes 3 us longer.
    if PREFETCH:
        prefetch_l2(o_w_ptr, H * Q_DIM * W_BYTES, pid, grid, 128)
        prefetch_l2(gu_ptr, 2 * INTER * H * W_BYTES, pid, grid, 128)
        prefetch_l2(down_ptr, H * INTER * W_BYTES, pid, grid, 128)
        prefetch_l2(next_ptr, next_bytes, pid, grid, 128)
    _phase_barrier(barrier_ptr, 1, FIRST, LAST)
    if FIRST <= 2 and 2 <= LAST:  # attention, split-major: the first items are the live ones
        rows_heads = M * KV_HEADS
        for item in range(pid, rows_heads * NUM_SPLITS, grid):
            split = item // rows_heads
            b = (item % rows_heads) // KV_HEADS
            attend_split(
                b, item % KV_HEADS, split, KV_HEADS, q_ptr, k_pool_ptr, v_pool_ptr, table_ptr,
                lens_ptr, attn_ptr, m_ptr, l_ptr, acc_ptr, arrivals_ptr, Q_DIM, HEAD_DIM,
                stride_kpt, stride_kph, stride_vpt, stride_vph, stride_tb, Q_DIM, HEAD_DIM,
                block_size, split_tokens, qk_scale_log2, GROUP, HEAD_DIM, NUM_SPLITS, BLOCK_S,
                BLOCK_G, ATT_N, BLOCK_DA, BLOCK_DB, USE_DOT,
            )  # fmt: skip
    _phase_barrier(barrier_ptr, 2, FIRST, LAST)
    if FIRST <= 3 and 3 <= LAST:  # xb = x + attention @ Wo.T
        for t in range(pid, tl.cdiv(H, O_N), grid):
            linear_tile(
                0, t, 0, counters_ptr, attn_ptr, o_w_ptr, o_w_ptr, x_ptr, xb_ptr, ws_ptr, M, H,
                Q_DIM, Q_DIM, Q_DIM, Q_DIM, H, H, eps, 0, True, 1, BLOCK_M, O_N, O_K, 0, 0, 0, 0,
                0,
            )  # fmt: skip
    _phase_barrier(barrier_ptr, 3, FIRST, LAST)
    if FIRST <= 4 and 4 <= LAST:  # act = silu(norm(xb) @ Wg.T) * (norm(xb) @ Wu.T)
        for t in range(pid, tl.cdiv(INTER, GU_N), grid):
            swiglu_tile(
                0, t, 0, counters_ptr, xb_ptr, post_norm_ptr, gu_ptr, act_ptr, ws_ptr, M, INTER,
                H, H, H, H, INTER, eps, (H + GU_K - 1) // GU_K, 1, BLOCK_M, GU_N, GU_K, 0, 0, 0,
                0, 0, 0, 0, 0, 0,
            )  # fmt: skip
    _phase_barrier(barrier_ptr, 4, FIRST, LAST)
    if FIRST <= 5 and 5 <= LAST:  # x = xb + act @ Wd.T, split over K, tile-major
        for item in range(pid, tl.cdiv(H, DN_N) * DN_SPLITS, grid):
            tile = item // DN_SPLITS
            linear_tile(
                0, tile, item % DN_SPLITS, counters_ptr + tile, act_ptr, down_ptr, down_ptr,
                xb_ptr, x_ptr, ws_ptr, M, H, INTER, down_split_len, INTER, INTER, H, H, eps, 0,
                True, DN_SPLITS, BLOCK_M, DN_N, DN_K, 0, 0, 0, 0, 0,
            )  # fmt: skip
    if FIRST < LAST:
        leave(barrier_ptr)


@functools.cache
def _barrier_counters(device: torch.device) -> torch.Tensor:
    return torch.zeros(2, device=device, dtype=torch.int32)


class DecodeLayers:
    """What every layer's launch of one decode step shares: the scratch buffers, the tiles, the
    work split and the grid. `run(x, ...)` updates the residual x [M, H] in place.
    On the CPU (Triton's interpreter) each layer runs as five launches, one a phase."""

    def __init__(
        self, spec, rows: int, max_len: int, device, dtype, sm_count: int,
        prefetch: bool = True, grid: int | None = None, attention_splits: int | None = None,
        warps: int = 4,
    ):  # fmt: skip
        """`prefetch`: pull the later phases' weights into L2 after the first phase, where the
        GPU's L2 holds a layer (off in the interpreter). `grid` (programs, at most one an SM by
        default), `attention_splits` and `warps` override the defaults
        (scripts/bench_decode_layer.py)."""
        assert rows <= MAX_ROWS, f"{rows} rows: the persistent layer takes at most {MAX_ROWS}"
        device = torch.device(device)
        self.spec, self.rows = spec, rows
        h, inter, d = spec.hidden_size, spec.intermediate_size, spec.head_dim
        heads, kv_heads = spec.num_heads, spec.num_kv_heads
        assert d % 2 == 0 and d <= 256, f"head_dim {d} must be even and <= 256"
        q_dim, kv_dim = heads * d, kv_heads * d
        block_d = max(16, triton.next_power_of_2(d))
        parts = (block_d, 0)  # one padded part: the split head was not measured here
        group = heads // kv_heads
        _, qkv_n, qkv_k, _, _ = few_row_tiles(rows, (q_dim + 2 * kv_dim) // 2, sm_count, 2)
        _, o_n, o_k, _, _ = few_row_tiles(rows, h, sm_count)
        _, gu_n, gu_k, _, _ = few_row_tiles(rows, inter, sm_count, 2, prefer=(32, 64, 4, 4))
        _, dn_n, dn_k, _, _ = few_row_tiles(rows, h, sm_count, prefer=LONG_K_TILES)
        dn_tiles = host_cdiv(h, dn_n)
        dn_splits = max(1, min(host_cdiv(inter, dn_k), sm_count // dn_tiles))
        self.down_split_len = split_range(inter, dn_k, dn_splits)
        dn_splits = host_cdiv(inter, self.down_split_len)
        # the attention: about a program an SM over the (row, kv head) pairs, at most 16 splits
        splits = max(1, min(16, sm_count // (rows * kv_heads), host_cdiv(max_len, SPLIT_TOKENS)))
        splits = attention_splits or splits
        # The persistent layer keeps tiles of 32 tokens or more, with SPLIT_TOKENS: the
        # attention's 16-token tiles are untried in it.
        tiles = default_tiles(rows, kv_heads, block_d, sm_count, device_capability(device))
        att_n = max(32, tiles[0])
        items = (
            host_cdiv((q_dim + 2 * kv_dim) // 2, qkv_n), rows * kv_heads * splits,
            host_cdiv(h, o_n), host_cdiv(inter, gu_n), dn_tiles * dn_splits,
        )  # fmt: skip
        self.grid = (grid or max(1, min(sm_count, max(items))),)
        self.meta = dict(
            H=h, INTER=inter, Q_DIM=q_dim, KV_DIM=kv_dim, HEAD_DIM=d, GROUP=group,
            KV_HEADS=kv_heads, NUM_SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits),
            BLOCK_G=max(16, triton.next_power_of_2(group)) if group > 1 else 1,
            BLOCK_DA=parts[0], BLOCK_DB=parts[1], ATT_N=att_n, USE_DOT=group > 1, QKV_N=qkv_n,
            QKV_K=qkv_k,
            O_N=o_n, O_K=o_k, GU_N=gu_n, GU_K=gu_k, DN_N=dn_n, DN_K=dn_k, DN_SPLITS=dn_splits,
            BLOCK_M=MAX_ROWS, W_BYTES=torch.empty((), dtype=dtype).element_size(),
        )  # fmt: skip
        self.scale_log2 = math.log2(math.e) / math.sqrt(d)
        empty = functools.partial(torch.empty, device=device)
        self.xb = empty(rows, h, dtype=dtype)
        self.q = empty(rows, q_dim, dtype=dtype)
        self.attn = empty(rows, q_dim, dtype=dtype)
        self.m = empty(rows, heads, splits, dtype=torch.float32)
        self.l_s = empty(rows, heads, splits, dtype=torch.float32)
        self.acc = empty(rows, heads, splits, sum(parts), dtype=torch.float32)
        self.act = empty(rows, inter, dtype=dtype)
        self.ws = empty(dn_splits, rows, h, dtype=torch.float32)
        counters = counters_for(device, dn_tiles + ATTENTION_COUNTERS)
        self.tile_counters = counters[:dn_tiles]
        self.arrivals = counters[-ATTENTION_COUNTERS:]  # apart from the down's: never shared
        assert rows * kv_heads <= ATTENTION_COUNTERS
        self.barrier = _barrier_counters(device)
        self.phased = device.type != "cuda"
        # L2 prefetch: inline PTX (not in the interpreter), and only where L2 holds a layer
        layer_bytes = (h * (q_dim + 2 * kv_dim) + h * q_dim + 3 * inter * h) * self.meta["W_BYTES"]
        self.prefetch = prefetch and not self.phased and l2_holds(device, layer_bytes)
        self.stages, self.warps = 3, warps
        self.compiled = None  # the last launch's compiled kernel (registers, shared memory)

    def run(
        self, x, weights, cos, sin, write_index, k_pool, v_pool, table, kv_lens, block_size,
        next_weight=None,
    ):  # fmt: skip
        """One layer on x [rows, H] (in place). weights: LayerWeights with the fused QKV and
        gate-up; cos/sin [rows, head_dim/2]; pools [slots, kv_heads, head_dim] of this layer;
        table [rows, W] and kv_lens [rows] as the decode attention reads them; next_weight, the
        first weight the next kernel reads, is prefetched into L2 (with this layer's later
        weights) where `self.prefetch`."""
        (qkv,), (gate_up,) = weights.qkv, weights.gate_up
        assert x.shape == (self.rows, self.spec.hidden_size) and x.is_contiguous()
        assert cos.stride(-1) == 1 and sin.stride(-1) == 1
        args = (
            x, self.xb, cos, sin, write_index, table, kv_lens, weights.input_norm, qkv,
            weights.o, weights.post_norm, gate_up, weights.down, k_pool, v_pool, self.q,
            self.attn, self.m, self.l_s, self.acc, self.arrivals, self.act, self.ws,
            self.tile_counters, self.barrier,
            weights.o if next_weight is None else next_weight,
            0 if next_weight is None else next_weight.numel() * next_weight.element_size(),
            self.rows, self.down_split_len, block_size,
            SPLIT_TOKENS, self.scale_log2, self.spec.rms_norm_eps, cos.stride(0), sin.stride(0),
            k_pool.stride(0), k_pool.stride(1), v_pool.stride(0), v_pool.stride(1),
            table.stride(0),
        )  # fmt: skip
        spans = [(p, p) for p in range(1, PHASES + 1)] if self.phased else [(1, PHASES)]
        for first, last in spans:
            self._launch(args, first, last)

    def _launch(self, args, first: int, last: int) -> None:
        while True:
            try:
                self.compiled = _decode_layer_kernel[self.grid](
                    *args, **self.meta, FIRST=first, LAST=last,
                    PREFETCH=self.prefetch and first == 1, num_warps=self.warps,
                    num_stages=self.stages,
                )  # fmt: skip
                return
            except OutOfResources:  # a 99 KiB RTX 3090 block: raised before anything runs
                if self.stages == 2:
                    raise
                self.stages = 2


ATTENTION_COUNTERS = 1024  # (row, kv head) arrival counters of the attention phase
