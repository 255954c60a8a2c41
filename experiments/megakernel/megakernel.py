"""The decode step's layer stack as one persistent CUDA kernel (MEGAKERNEL.md, milestone M1):
a block an SM walks its queue of tasks (megakernel_schedule.py); its producer warp streams each
task's 16-row weight tile into a shared-memory ring (cp.async onto mbarriers) while its consumer
warps wait on counters, compute with mma.sync, store and signal. Rounds like the fused kernels.
Not wired into the engine: bench_megakernel.py checks and times it on the GPU.
Needs nvcc and ninja (torch.utils.cpp_extension), compute capability >= 8.0, float16 or
bfloat16 (one a build), up to 8 rows, head_dim a multiple of 16."""

import dataclasses
import hashlib
import math
import re
import statistics
import struct
import subprocess
import tempfile
from pathlib import Path

import torch

from experiments.megakernel.megakernel_schedule import (
    ATTN_BLOCK,
    DONE,
    FIELDS,
    NONE,
    PAIRS,
    ROWS,
    TILE_ROWS,
    MegaShape,
    Op,
    Schedule,
)

# The kernel's arguments, one 8-byte word each (pointers, integers, doubles), in the order of
# its `Params` struct, which `kernel_source` writes from this table.
PARAMS = (
    ("queue", "const int*"), ("tasks", "const int4*"), ("sync", "int*"), ("error", "int*"),
    ("layer_ptrs", "const long long*"), ("x_in", "const elem*"), ("xs", "elem*"),
    ("xmid", "elem*"), ("q", "elem*"), ("o", "elem*"), ("act", "elem*"), ("part_o", "float*"),
    ("part_down", "float*"), ("attn_m", "float*"), ("attn_l", "float*"), ("attn_acc", "float*"),
    ("cos", "const elem*"), ("sin", "const elem*"), ("positions", "const long long*"),
    ("write_index", "const long long*"), ("kv_lens", "const long long*"), ("table", "const int*"),
    ("n_counters", "long long"), ("rows", "long long"), ("attn_splits", "long long"),
    ("split_tokens", "long long"), ("block_size", "long long"), ("table_stride", "long long"),
    ("rope_stride", "long long"), ("k_stride_token", "long long"), ("k_stride_head", "long long"),
    ("v_stride_token", "long long"), ("v_stride_head", "long long"), ("eps", "double"),
    ("qk_scale_log2", "double"), ("prof", "long long*"), ("spin_ns", "long long"),
)  # fmt: skip
# Each layer's pointers, a row of `layer_ptrs`.
LAYER_POINTERS = ("input_norm", "qkv", "o", "post_norm", "gate_up", "down", "k_pool", "v_pool")
SYNC_HEADER = 4  # sync[0]: the epoch; then two banks of counters
ERROR_WORDS = 10  # set, block, task index, op, layer, tile, split, counter, target, value seen
WATCHDOG_CYCLES = 2_000_000_000  # ~1 s at the H200's 1.98 GHz: a spin this long traps
SPLIT_TOKENS = 64  # an ATTN split's fewest keys (each live split gets at least this many)
ELEMENT_TYPES = (torch.float16, torch.bfloat16)  # what the kernel computes in (one a build)
SPIN_NS = 512  # a waiting lane's longest sleep between polls (it doubles from 32 ns up to it)
STAMPS = ("start", "ready", "weights", "done")  # a profiled task's times (PROFILE_STAMPS)
# Shared memory a block may take (sm_90: 227 KiB, sm_80: 163, sm_86/89: 99), less the static
# part's margin (mbarriers, reduction and attention scratch).
SHARED_BYTES = {"90": 227 * 1024, "80": 163 * 1024, "86": 99 * 1024, "89": 99 * 1024}
STATIC_MARGIN = 6 * 1024

ELEMENT_SOURCE = r"""
// ---- the element type (float16, or bfloat16 where ELEM_BF16): its conversions round to nearest
#if ELEM_BF16
typedef __nv_bfloat16 elem;
typedef __nv_bfloat162 elem2;
#define MMA_AB "bf16"
#define ELEM_FN(f16, bf16) bf16
#else
typedef __half elem;
typedef __half2 elem2;
#define MMA_AB "f16"
#define ELEM_FN(f16, bf16) f16
#endif
__device__ __forceinline__ elem to_elem(float v) {
    return ELEM_FN(__float2half_rn, __float2bfloat16_rn)(v);
}
__device__ __forceinline__ float widen(elem v) {
    return ELEM_FN(__half2float, __bfloat162float)(v);
}
__device__ __forceinline__ float2 widen2(elem2 v) {
    return ELEM_FN(__half22float2, __bfloat1622float2)(v);
}
__device__ __forceinline__ elem2 pack2(float a, float b) {
    return ELEM_FN(__floats2half2_rn, __floats2bfloat162_rn)(a, b);
}
__device__ __forceinline__ elem2 pair2(elem a, elem b) {
    return ELEM_FN(__halves2half2, __halves2bfloat162)(a, b);
}
__device__ __forceinline__ elem2 zero2() { return pack2(0.f, 0.f); }
"""

CUDA_SOURCE = r"""
constexpr int SLOT_STRIDE = MAX_KLEN + 8;  // halves a weight row takes in a slot: 16 more bytes
// put the 8 rows an mma fragment reads in 8 distinct bank groups
constexpr int SLOT_HALVES = TILE_ROWS * SLOT_STRIDE;
constexpr int CONSUMERS = CONSUMER_WARPS * 32;
constexpr int THREADS = CONSUMERS + 32;  // the producer warp is the last
constexpr int Q_DIM = HEADS * HEAD_DIM;
constexpr int KV_DIM = KV_HEADS * HEAD_DIM;
constexpr int GROUP = HEADS / KV_HEADS;
constexpr int DOWN_SPLITS = INTER / DOWN_CHUNK;
constexpr int HEAD_SLICE = (HEAD_DIM + CONSUMERS - 1) / CONSUMERS;  // dims a thread combines
constexpr int HALF_DIM = HEAD_DIM / 2;  // elem2 of a key, a value or a head's output
constexpr int NORM_PIECES = (HIDDEN / 2 + 31) / 32;  // elem2 of a row a lane holds to norm it
constexpr int STAGE_PIECES = (MAX_KLEN / 2 + 31) / 32;  // elem2 of a row a lane stages
constexpr int KEY_PIECES = (HALF_DIM + 31) / 32;  // elem2 of a key a lane scores
constexpr int KEYS_PER_WARP = ATTN_BLOCK / CONSUMER_WARPS;
constexpr int MAX_SPLITS = HEADS > INTER / DOWN_CHUNK ? HEADS : INTER / DOWN_CHUNK;
static_assert(ATTN_BLOCK == 32, "an ATTN tile's keys are a warp's lanes");
static_assert(ATTN_BLOCK % CONSUMER_WARPS == 0, "an ATTN tile's keys split evenly over warps");
static_assert(HALF_DIM <= CONSUMERS, "a thread owns two dims of a head's output");
static_assert(GROUP <= 8 && HEAD_DIM % 16 == 0 && MAX_KLEN % 16 == 0, "unsupported shape");
static_assert(sizeof(Params) == PARAM_WORDS * 8, "Params as packed by megakernel.py");

struct Shared {
    unsigned long long full[RING_SLOTS];   // a slot's weights landed (32 producer arrivals)
    unsigned long long empty[RING_SLOTS];  // a slot's weights read (one arrival a consumer warp)
    float red[CONSUMER_WARPS][TILE_ROWS][ROWS];  // each warp's share of the K reduction
    float q[GROUP][HEAD_DIM];
    float score[GROUP][ATTN_BLOCK];
    elem p[GROUP][ATTN_BLOCK];
    float alpha[GROUP], m[GROUP], l[GROUP];
    long long slot[ATTN_BLOCK];
    // each row's step inputs, read once a launch (no load chain in the tasks that use them)
    long long position[ROWS], write_index[ROWS], first_slot[ROWS];
    int kv_len[ROWS];
    int flag, epoch;
};

// ---- PTX ----
__device__ __forceinline__ unsigned smem(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(unsigned long long* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem(bar)), "r"(count)
                 : "memory");
}
__device__ __forceinline__ bool mbar_test(unsigned long long* bar, unsigned parity) {
    unsigned ok;
    asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;"
                 " selp.u32 %0, 1, 0, p; }" : "=r"(ok) : "r"(smem(bar)), "r"(parity) : "memory");
    return ok;
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }"
                 :: "r"(smem(bar)) : "memory");
}
__device__ __forceinline__ void cp_async16(elem* dst, const elem* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                 :: "r"(smem(dst)), "l"(src) : "memory");
}
// an arrival on `bar` once this lane's cp.asyncs have landed
__device__ __forceinline__ void cp_async_arrive(unsigned long long* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];"
                 :: "r"(smem(bar)) : "memory");
}
__device__ __forceinline__ int ld_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void fence_acq_rel() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
__device__ __forceinline__ void red_release_add(int* p, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ int atom_acq_rel_add(int* p, int v) {
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;"
                 : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}
__device__ __forceinline__ long long global_ns() {  // comparable across SMs, unlike clock64
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void consumer_barrier() {  // the consumer warps only (id 1)
    asm volatile("bar.sync 1, %0;" :: "n"(CONSUMERS) : "memory");
}
__device__ __forceinline__ void mma16816(float* c, const unsigned* a, const unsigned* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_AB "." MMA_AB ".f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ unsigned ld32(const elem* p) {
    return *reinterpret_cast<const unsigned*>(p);
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// ---- the step's buffers ----
__device__ __forceinline__ const elem* layer_weight(const Params& p, int layer, int which) {
    return reinterpret_cast<const elem*>(p.layer_ptrs[layer * LAYER_POINTER_COUNT + which]);
}
__device__ __forceinline__ elem* layer_pool(const Params& p, int layer, int which) {
    return reinterpret_cast<elem*>(p.layer_ptrs[layer * LAYER_POINTER_COUNT + which]);
}
__device__ __forceinline__ const elem* x_in_layer(const Params& p, int l) {  // x_l
    return l == 0 ? p.x_in : p.xs + (size_t)(l - 1) * ROWS * HIDDEN;
}
__device__ __forceinline__ elem* x_out_layer(const Params& p, int l) {  // x_(l+1)
    return p.xs + (size_t)l * ROWS * HIDDEN;
}
__device__ __forceinline__ elem* xmid_of(const Params& p, int l) {
    return p.xmid + (size_t)l * ROWS * HIDDEN;
}
__device__ __forceinline__ elem* q_of(const Params& p, int l) {
    return p.q + (size_t)l * ROWS * Q_DIM;
}
__device__ __forceinline__ elem* o_of(const Params& p, int l) {  // the attention's output
    return p.o + (size_t)l * ROWS * Q_DIM;
}
__device__ __forceinline__ elem* act_of(const Params& p, int l) {
    return p.act + (size_t)l * ROWS * INTER;
}

__device__ __forceinline__ Task load_task(const Params& p, int i) {
    const int4 a = __ldg(p.tasks + 2 * i), b = __ldg(p.tasks + 2 * i + 1);
    return Task{a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
}

// A spin that outlives WATCHDOG_CYCLES names its task in the error words and traps.
__device__ __noinline__ void stuck(const Params& p, int index, Task t, int counter,
                                   int seen) {
    if (atomicCAS(p.error, 0, 1) == 0) {
        const int words[ERROR_WORDS - 1] = {(int)blockIdx.x, index, t.op, t.layer, t.tile,
                                            t.split, counter, t.target, seen};
        for (int i = 0; i < ERROR_WORDS - 1; ++i) p.error[1 + i] = words[i];
        __threadfence_system();
        printf("megakernel watchdog: block %d task %d (op %d, layer %d, tile %d, split %d) "
               "waits for counter %d (-1: its weight slot) to reach %d, at %d\n", (int)blockIdx.x,
               index, t.op, t.layer, t.tile, t.split, counter, t.target, seen);
    }
    __trap();
}

__device__ void wait_slot(unsigned long long* bar, unsigned parity, const Params& p, int index,
                          const Task& t) {
    const long long start = clock64();
    while (!mbar_test(bar, parity))
        if (clock64() - start > WATCHDOG_CYCLES) stuck(p, index, t, NO_COUNTER, -1);
}

// One consumer lane acquires the counter, then a barrier releases the consumer warps.
__device__ void wait_counter(const Params& p, const int* counter, int index, const Task& t) {
    if (threadIdx.x == 0) {
        const long long start = clock64();
        const unsigned most = (unsigned)p.spin_ns;
        unsigned ns = most < 32 ? most : 32;
        for (int seen; (seen = ld_acquire(counter)) < t.target;) {
            if (clock64() - start > WATCHDOG_CYCLES) stuck(p, index, t, t.wait, seen);
            if (ns) __nanosleep(ns);
            ns = 2 * ns < most ? 2 * ns : most;
        }
    }
    consumer_barrier();
}

// Stores, a barrier, then one lane publishes them at GPU scope.
__device__ __forceinline__ void signal(int* counter) {
    consumer_barrier();
    if (threadIdx.x == 0) {
        fence_acq_rel();
        red_release_add(counter, 1);
    }
}

// True in every consumer thread of the last of `count` splits to arrive, which then sees the
// others' partials.
__device__ bool arrive_last(Shared& sh, int* counter, int count) {
    consumer_barrier();
    if (threadIdx.x == 0) {
        fence_acq_rel();
        sh.flag = atom_acq_rel_add(counter, 1) == count - 1;
    }
    consumer_barrier();
    return sh.flag;
}

// ---- producer: the weight tiles, in queue order, into the ring ----
struct TileSpan { const elem* base; int stride, k0, klen; };

__device__ __forceinline__ TileSpan tile_span(const Params& p, const Task& t) {
    switch (t.op) {
        case OP_QKV: return {layer_weight(p, t.layer, LP_QKV), HIDDEN, 0, HIDDEN};
        case OP_GATEUP: return {layer_weight(p, t.layer, LP_GATE_UP), HIDDEN, 0, HIDDEN};
        case OP_OPROJ:
            return {layer_weight(p, t.layer, LP_O), Q_DIM, t.split * HEAD_DIM, HEAD_DIM};
        default:
            return {layer_weight(p, t.layer, LP_DOWN), INTER, t.split * DOWN_CHUNK, DOWN_CHUNK};
    }
}

// The weight row a slot row r holds (MegaShape.weight_rows): QKV pairs and GATEUP's gate and
// up columns split over rows i and i + 8, which land in one thread of an mma.
__device__ __forceinline__ int weight_row(const Task& t, int r) {
    switch (t.op) {
        case OP_QKV: return 2 * (t.tile * PAIRS + r % PAIRS) + r / PAIRS;
        case OP_GATEUP: return (r / PAIRS) * INTER + t.tile * PAIRS + r % PAIRS;
        default: return t.tile * TILE_ROWS + r;
    }
}

__device__ void produce(const Params& p, Shared& sh, elem* ring, int begin, int end, int* other) {
    const int lane = threadIdx.x & 31;
    // The other bank, for the next step: its last user, the step before, has ended.
    for (int i = blockIdx.x * 32 + lane; i < p.n_counters; i += gridDim.x * 32) other[i] = 0;
    int w = 0;
    Task next = begin < end ? load_task(p, begin) : Task{};
    for (int i = begin; i < end; ++i) {
        const Task t = next;
        if (i + 1 < end) next = load_task(p, i + 1);  // in flight while this one's loads issue
        if (t.op == OP_ATTN) continue;
        const int slot = w % RING_SLOTS;
        wait_slot(&sh.empty[slot], ((w / RING_SLOTS) & 1) ^ 1, p, i, t);
        const TileSpan s = tile_span(p, t);
        elem* dst = ring + slot * SLOT_HALVES;
        const int pieces = s.klen / 8;  // 16 bytes each
        for (int c = lane; c < TILE_ROWS * pieces; c += 32) {
            const int r = c / pieces, k = (c % pieces) * 8;
            const elem* src = s.base + (size_t)weight_row(t, r) * s.stride + s.k0 + k;
            cp_async16(dst + r * SLOT_STRIDE + k, src);
        }
        cp_async_arrive(&sh.full[slot]);
        ++w;
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
}

// ---- consumers ----
// The task's activation rows [ROWS, klen] into hs (rows past p.rows zero): QKV and GATEUP
// RMS-norm theirs as the reference rounds (normed x cast, times the weight, cast).
__device__ void stage(const Params& p, const Task& t, elem* hs, int klen) {
    const elem* src;
    const elem* norm = nullptr;
    int stride = HIDDEN, k0 = 0;
    switch (t.op) {
        case OP_QKV:
            src = x_in_layer(p, t.layer);
            norm = layer_weight(p, t.layer, LP_INPUT_NORM);
            break;
        case OP_GATEUP:
            src = xmid_of(p, t.layer);
            norm = layer_weight(p, t.layer, LP_POST_NORM);
            break;
        case OP_OPROJ: src = o_of(p, t.layer); stride = Q_DIM; k0 = t.split * HEAD_DIM; break;
        default: src = act_of(p, t.layer); stride = INTER; k0 = t.split * DOWN_CHUNK;
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int r = warp; r < ROWS; r += CONSUMER_WARPS) {
        elem2* dst = reinterpret_cast<elem2*>(hs + r * SLOT_STRIDE);
        const elem2* row = reinterpret_cast<const elem2*>(src + (size_t)r * stride + k0);
        if (r >= p.rows) {
            for (int k = lane; k < klen / 2; k += 32) dst[k] = zero2();
        } else if (norm == nullptr) {
            elem2 v[STAGE_PIECES];
#pragma unroll
            for (int j = 0; j < STAGE_PIECES; ++j) {
                const int k = lane + 32 * j;
                v[j] = k < klen / 2 ? __ldcg(row + k) : zero2();
            }
#pragma unroll
            for (int j = 0; j < STAGE_PIECES; ++j)
                if (lane + 32 * j < klen / 2) dst[lane + 32 * j] = v[j];
        } else {
            // the row and the norm's weights loaded together, then used
            const elem2* g = reinterpret_cast<const elem2*>(norm);
            elem2 v[NORM_PIECES], gw[NORM_PIECES];
#pragma unroll
            for (int j = 0; j < NORM_PIECES; ++j) {
                const int k = lane + 32 * j;
                v[j] = k < HIDDEN / 2 ? __ldcg(row + k) : zero2();
                gw[j] = k < HIDDEN / 2 ? __ldg(g + k) : zero2();
            }
            float squares = 0.f;
#pragma unroll
            for (int j = 0; j < NORM_PIECES; ++j) {
                const float2 f = widen2(v[j]);
                squares += f.x * f.x + f.y * f.y;
            }
            const float inv = rsqrtf(warp_sum(squares) / HIDDEN + (float)p.eps);
#pragma unroll
            for (int j = 0; j < NORM_PIECES; ++j) {
                const int k = lane + 32 * j;
                if (k >= HIDDEN / 2) break;
                const float2 f = widen2(v[j]);
                const float2 n = widen2(pack2(f.x * inv, f.y * inv));
                const float2 w = widen2(gw[j]);
                dst[k] = pack2(n.x * w.x, n.y * w.y);
            }
        }
    }
}

// RoPE on one pair as eager torch rounds it: every product and sum cast to the compute dtype.
__device__ __forceinline__ void rotate(elem x0, elem x1, float c, float s, elem& r0, elem& r1) {
    const float a = widen(to_elem(widen(x0) * c)), b = widen(to_elem(widen(x1) * s));
    const float e = widen(to_elem(widen(x0) * s)), f = widen(to_elem(widen(x1) * c));
    r0 = to_elem(a - b);
    r1 = to_elem(e + f);
}

// Rows r and r + 8 of activation row n, summed over the warps in warp order.
__device__ __forceinline__ float2 paired_sums(const Shared& sh, int r, int n) {
    float2 v = make_float2(0.f, 0.f);
    for (int w = 0; w < CONSUMER_WARPS; ++w) {
        v.x += sh.red[w][r][n];
        v.y += sh.red[w][r + PAIRS][n];
    }
    return v;
}

__device__ void qkv_epilogue(const Params& p, const Shared& sh, const Task& t) {
    const int pair = threadIdx.x % PAIRS, n = threadIdx.x / PAIRS;
    if (n >= p.rows) return;
    const float2 sums = paired_sums(sh, pair, n);  // the pair's even and odd columns
    const elem x0 = to_elem(sums.x), x1 = to_elem(sums.y);
    const int col = 2 * (t.tile * PAIRS + pair), dim = col % HEAD_DIM;
    if (col >= Q_DIM + KV_DIM) {  // v: stored as projected
        const int head = (col - Q_DIM - KV_DIM) / HEAD_DIM;
        elem* v = layer_pool(p, t.layer, LP_V_POOL) + sh.write_index[n] * p.v_stride_token;
        *reinterpret_cast<elem2*>(v + head * p.v_stride_head + dim) = pair2(x0, x1);
        return;
    }
    const long long at = sh.position[n] * p.rope_stride + dim / 2;
    elem r0, r1;
    rotate(x0, x1, widen(p.cos[at]), widen(p.sin[at]), r0, r1);
    if (col < Q_DIM) {
        *reinterpret_cast<elem2*>(q_of(p, t.layer) + n * Q_DIM + col) = pair2(r0, r1);
    } else {
        const int head = (col - Q_DIM) / HEAD_DIM;
        elem* k = layer_pool(p, t.layer, LP_K_POOL) + sh.write_index[n] * p.k_stride_token;
        *reinterpret_cast<elem2*>(k + head * p.k_stride_head + dim) = pair2(r0, r1);
    }
}

// silu(gate) * up: gate and up cast, silu in float32 cast, the product cast once.
__device__ void gateup_epilogue(const Params& p, const Shared& sh, const Task& t) {
    const int j = threadIdx.x % PAIRS, n = threadIdx.x / PAIRS;
    if (n >= p.rows) return;
    const float2 sums = paired_sums(sh, j, n);  // gate, up
    const float g = widen(to_elem(sums.x));
    const float act = widen(to_elem(g / (1.f + expf(-g)))), up = widen(to_elem(sums.y));
    act_of(p, t.layer)[n * INTER + t.tile * PAIRS + j] = to_elem(act * up);
}

// The split's partial, then in the last split to arrive: the partials summed in split order,
// cast, plus the residual in float32, cast once.
__device__ void residual_epilogue(const Params& p, Shared& sh, const Task& t, int* bank) {
    const bool oproj = t.op == OP_OPROJ;
    const int splits = oproj ? HEADS : DOWN_SPLITS;
    float* part = oproj ? p.part_o : p.part_down;
    const int r = threadIdx.x % TILE_ROWS, n = threadIdx.x / TILE_ROWS;
    const int col = t.tile * TILE_ROWS + r;
    const bool mine = n < p.rows;  // CONSUMERS >= TILE_ROWS * ROWS
    if (mine) {
        float v = 0.f;
        for (int w = 0; w < CONSUMER_WARPS; ++w) v += sh.red[w][r][n];
        part[((size_t)t.split * ROWS + n) * HIDDEN + col] = v;
    }
    if (!arrive_last(sh, bank + t.arrive, splits) || !mine) return;
    const elem* res = oproj ? x_in_layer(p, t.layer) : xmid_of(p, t.layer);
    const elem residual = __ldcg(res + n * HIDDEN + col);
    float parts[MAX_SPLITS];
#pragma unroll
    for (int s = 0; s < MAX_SPLITS; ++s)
        parts[s] = s < splits ? __ldcg(part + ((size_t)s * ROWS + n) * HIDDEN + col) : 0.f;
    float total = 0.f;
#pragma unroll
    for (int s = 0; s < MAX_SPLITS; ++s)
        if (s < splits) total += parts[s];
    elem* out = oproj ? xmid_of(p, t.layer) : x_out_layer(p, t.layer);
    const float y = widen(to_elem(total));
    out[n * HIDDEN + col] = to_elem(widen(residual) + y);
}

// QKV, OPROJ, GATEUP, DOWN: h [ROWS, klen] (staged, or still there from the task before) times
// the slot's 16 weight rows, each warp a share of the K steps, then the op's epilogue.
__device__ void project(const Params& p, Shared& sh, elem* ring, elem* hs, int& staged,
                        const Task& t, int w, int index, int* bank, long long& weights_at) {
    const int klen = t.op == OP_OPROJ ? HEAD_DIM : (t.op == OP_DOWN ? DOWN_CHUNK : HIDDEN);
    const int key = (t.layer * 8 + t.op) * 64 + t.split;  // what hs holds
    if (key != staged) {
        stage(p, t, hs, klen);
        consumer_barrier();
        staged = key;
    }
    const int slot = w % RING_SLOTS;
    wait_slot(&sh.full[slot], (w / RING_SLOTS) & 1, p, index, t);
    if (p.prof != nullptr && threadIdx.x == 0) weights_at = global_ns();
    const elem* a = ring + slot * SLOT_HALVES;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q2 = 2 * (lane % 4);
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    for (int ks = warp; ks < klen / 16; ks += CONSUMER_WARPS) {
        const int k = ks * 16 + q2;
        const elem* lo = a + g * SLOT_STRIDE + k;  // weight rows g and g + 8
        const elem* hi = lo + 8 * SLOT_STRIDE;
        const elem* h = hs + g * SLOT_STRIDE + k;  // activation row g
        const unsigned af[4] = {ld32(lo), ld32(hi), ld32(lo + 8), ld32(hi + 8)};
        const unsigned bf[2] = {ld32(h), ld32(h + 8)};
        mma16816(c, af, bf);
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(&sh.empty[slot]);
    sh.red[warp][g][q2] = c[0];
    sh.red[warp][g][q2 + 1] = c[1];
    sh.red[warp][g + 8][q2] = c[2];
    sh.red[warp][g + 8][q2 + 1] = c[3];
    consumer_barrier();
    if (t.op == OP_QKV) {
        if (threadIdx.x < PAIRS * ROWS) qkv_epilogue(p, sh, t);
    } else if (t.op == OP_GATEUP) {
        if (threadIdx.x < PAIRS * ROWS) gateup_epilogue(p, sh, t);
    } else {
        residual_epilogue(p, sh, t, bank);
    }
}

__device__ __forceinline__ long long token_slot(const Params& p, const Shared& sh, int row,
                                                int pos) {
    if (p.block_size == 0) return sh.first_slot[row] + pos;  // the slab: the row's first slot
    const int* table = p.table + row * p.table_stride;
    return (long long)table[pos / p.block_size] * p.block_size + pos % p.block_size;
}

// One key split of row `row`'s kv head: as paged_decode_attention's split (online softmax in
// base 2, probabilities cast before @ V); the last live split to arrive combines.
__device__ void attend(const Params& p, Shared& sh, const Task& t, int* bank) {
    const int row = t.tile / KV_HEADS, kvh = t.tile % KV_HEADS, tid = threadIdx.x;
    const int warp = tid / 32, lane = tid % 32;
    const int kv_len = sh.kv_len[row], splits = (int)p.attn_splits;
    const int live = min(max((kv_len + (int)p.split_tokens - 1) / (int)p.split_tokens, 1), splits);
    if (t.split >= live) return;
    const int per = (kv_len + live - 1) / live;
    const int split_len = (per + ATTN_BLOCK - 1) / ATTN_BLOCK * ATTN_BLOCK;
    const int start = t.split * split_len, end = min(start + split_len, kv_len);
    const elem* kp = layer_weight(p, t.layer, LP_K_POOL) + kvh * p.k_stride_head;
    const elem* vp = layer_weight(p, t.layer, LP_V_POOL) + kvh * p.v_stride_head;
    const elem* q = q_of(p, t.layer) + row * Q_DIM + kvh * GROUP * HEAD_DIM;
    for (int i = tid; i < GROUP * HEAD_DIM; i += CONSUMERS)
        sh.q[i / HEAD_DIM][i % HEAD_DIM] = widen(__ldcg(q + i));
    if (tid < GROUP) {
        sh.m[tid] = -INFINITY;
        sh.l[tid] = 0.f;
    }
    // thread `tid` < HALF_DIM owns dims 2 tid and 2 tid + 1 of each head's output
    const bool owns = tid < HALF_DIM;
    float2 acc[GROUP] = {};
    consumer_barrier();
    const float scale = (float)p.qk_scale_log2;
    for (int n0 = start; n0 < end; n0 += ATTN_BLOCK) {
        if (tid < ATTN_BLOCK) sh.slot[tid] = n0 + tid < end ? token_slot(p, sh, row, n0 + tid) : -1;
        consumer_barrier();
        // the tile's keys (this warp's: n = warp + j * warps) and this thread's values of every
        // key, all loaded together: the values do not wait for the scores
        elem2 keys[KEYS_PER_WARP][KEY_PIECES];
#pragma unroll
        for (int j = 0; j < KEYS_PER_WARP; ++j) {
            const long long slot = sh.slot[warp + j * CONSUMER_WARPS];
            const elem2* k = reinterpret_cast<const elem2*>(kp + max(slot, 0LL) * p.k_stride_token);
#pragma unroll
            for (int i = 0; i < KEY_PIECES; ++i) {
                const int d = lane + 32 * i;
                keys[j][i] = slot >= 0 && d < HALF_DIM ? __ldcg(k + d) : zero2();
            }
        }
        elem2 values[ATTN_BLOCK];
#pragma unroll
        for (int n = 0; n < ATTN_BLOCK; ++n) {
            const long long slot = sh.slot[n];
            const elem2* v = reinterpret_cast<const elem2*>(vp + max(slot, 0LL) * p.v_stride_token);
            values[n] = owns && slot >= 0 ? __ldcg(v + tid) : zero2();
        }
#pragma unroll
        for (int j = 0; j < KEYS_PER_WARP; ++j) {  // scores, a key a warp
            const int n = warp + j * CONSUMER_WARPS;
            float s[GROUP] = {};
#pragma unroll
            for (int i = 0; i < KEY_PIECES; ++i) {
                const int d = lane + 32 * i;
                if (d >= HALF_DIM) break;
                const float2 kf = widen2(keys[j][i]);
                for (int g = 0; g < GROUP; ++g)
                    s[g] += sh.q[g][2 * d] * kf.x + sh.q[g][2 * d + 1] * kf.y;
            }
            for (int g = 0; g < GROUP; ++g) {
                const float total = warp_sum(s[g]);
                if (lane == 0) sh.score[g][n] = sh.slot[n] >= 0 ? total * scale : -INFINITY;
            }
        }
        consumer_barrier();
        for (int g = warp; g < GROUP; g += CONSUMER_WARPS) {  // online softmax, a head a warp
            const float s = sh.score[g][lane], m_old = sh.m[g];
            const float m_new = fmaxf(m_old, warp_max(s));  // finite: the tile holds a key
            const float e = exp2f(s - m_new);
            const float total = warp_sum(e);
            sh.p[g][lane] = to_elem(e);
            __syncwarp();
            if (lane == 0) {
                const float alpha = exp2f(m_old - m_new);
                sh.alpha[g] = alpha;
                sh.l[g] = sh.l[g] * alpha + total;
                sh.m[g] = m_new;
            }
        }
        consumer_barrier();
        if (owns) {  // acc = acc * alpha + p @ V, summed in key order
            float2 pv[GROUP] = {};
#pragma unroll
            for (int n = 0; n < ATTN_BLOCK; ++n) {
                if (sh.slot[n] < 0) break;
                const float2 v = widen2(values[n]);
                for (int g = 0; g < GROUP; ++g) {
                    const float pn = widen(sh.p[g][n]);
                    pv[g].x += pn * v.x;
                    pv[g].y += pn * v.y;
                }
            }
            for (int g = 0; g < GROUP; ++g) {
                acc[g].x = acc[g].x * sh.alpha[g] + pv[g].x;
                acc[g].y = acc[g].y * sh.alpha[g] + pv[g].y;
            }
        }
        consumer_barrier();
    }
    elem* out = o_of(p, t.layer) + row * Q_DIM + kvh * GROUP * HEAD_DIM;
    if (live == 1) {  // the output itself (no keys: zeros)
        if (!owns) return;
        for (int g = 0; g < GROUP; ++g) {
            const float l = sh.l[g] > 0.f ? sh.l[g] : 1.f;
            reinterpret_cast<elem2*>(out + g * HEAD_DIM)[tid] = pack2(acc[g].x / l, acc[g].y / l);
        }
        return;
    }
    const int first = (row * HEADS + kvh * GROUP) * splits;  // partials [rows, heads, splits]
    for (int g = 0; g < GROUP; ++g) {
        const int at = first + g * splits + t.split;
        if (tid == 0) {
            p.attn_m[at] = sh.m[g];
            p.attn_l[at] = sh.l[g];
        }
        if (owns) reinterpret_cast<float2*>(p.attn_acc + (size_t)at * HEAD_DIM)[tid] = acc[g];
    }
    if (!arrive_last(sh, bank + t.arrive, live)) return;
    for (int g = 0; g < GROUP; ++g) {  // empty splits hold m = -inf: weight 0
        const int at = first + g * splits;
        float m_max = -INFINITY, total = 0.f;
        for (int s = 0; s < live; ++s) m_max = fmaxf(m_max, __ldcg(p.attn_m + at + s));
        m_max = m_max > -INFINITY ? m_max : 0.f;  // all empty: no -inf - -inf
        for (int s = 0; s < live; ++s)
            total += __ldcg(p.attn_l + at + s) * exp2f(__ldcg(p.attn_m + at + s) - m_max);
        for (int i = 0; i < HEAD_SLICE && tid + i * CONSUMERS < HEAD_DIM; ++i) {
            const int d = tid + i * CONSUMERS;
            float o = 0.f;
            for (int s = 0; s < live; ++s) {
                const float weight = exp2f(__ldcg(p.attn_m + at + s) - m_max);
                o += __ldcg(p.attn_acc + (size_t)(at + s) * HEAD_DIM + d) * weight;
            }
            out[g * HEAD_DIM + d] = to_elem(o / (total > 0.f ? total : 1.f));
        }
    }
}

__device__ void consume(const Params& p, Shared& sh, elem* ring, elem* hs, int begin, int end,
                        int* bank) {
    int w = 0, staged = -1;
    const bool profiled = p.prof != nullptr && threadIdx.x == 0;
    Task next = begin < end ? load_task(p, begin) : Task{};
    for (int i = begin; i < end; ++i) {
        const Task t = next;
        if (i + 1 < end) next = load_task(p, i + 1);  // in flight while this task runs
        const long long start = profiled ? global_ns() : 0;
        if (t.wait != NO_COUNTER) wait_counter(p, bank + t.wait, i, t);
        const long long ready = profiled ? global_ns() : 0;
        long long weights_at = ready;
        if (t.op == OP_ATTN) {
            attend(p, sh, t, bank);
        } else {
            project(p, sh, ring, hs, staged, t, w, i, bank, weights_at);
            ++w;
        }
        if (t.signal != NO_COUNTER) {
            signal(bank + t.signal);
        } else {
            consumer_barrier();  // inside a run: the next tile reuses the shared sums
        }
        if (profiled) {  // PROFILE_STAMPS: a task's times in ns, as STAMPS names them
            long long* at = p.prof + (size_t)i * PROFILE_STAMPS;
            at[0] = start;
            at[1] = ready;
            at[2] = weights_at;
            at[3] = global_ns();
        }
    }
    consumer_barrier();
    if (threadIdx.x == 0) {  // the last block done advances the epoch: the next step's bank
        fence_acq_rel();
        if (atom_acq_rel_add(bank + DONE_COUNTER, 1) == (int)gridDim.x - 1) atomicAdd(p.sync, 1);
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
megakernel(const __grid_constant__ Params p) {
    extern __shared__ __align__(16) unsigned char dynamic_smem[];
    __shared__ Shared sh;
    elem* ring = reinterpret_cast<elem*>(dynamic_smem);
    elem* hs = ring + RING_SLOTS * SLOT_HALVES;
    if (threadIdx.x == 0) {
        sh.epoch = *reinterpret_cast<volatile int*>(p.sync);
        for (int s = 0; s < RING_SLOTS; ++s) {
            mbar_init(&sh.full[s], 32);
            mbar_init(&sh.empty[s], CONSUMER_WARPS);
        }
#if __CUDA_ARCH__ >= 900  // the inits visible to the async proxy too (as CUTLASS does)
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
    }
    if (threadIdx.x < ROWS) {  // rows past p.rows: never read
        const int n = threadIdx.x < p.rows ? threadIdx.x : 0;
        sh.position[threadIdx.x] = p.positions[n];
        sh.write_index[threadIdx.x] = p.write_index[n];
        sh.kv_len[threadIdx.x] = (int)p.kv_lens[n];
        sh.first_slot[threadIdx.x] = p.block_size == 0 ? (long long)p.table[n * p.table_stride] : 0;
    }
    __syncthreads();
    int* bank = p.sync + SYNC_HEADER + (sh.epoch & 1) * p.n_counters;
    int* other = p.sync + SYNC_HEADER + ((sh.epoch + 1) & 1) * p.n_counters;
    const int begin = p.queue[blockIdx.x], end = p.queue[blockIdx.x + 1];
    if (threadIdx.x >= CONSUMERS) produce(p, sh, ring, begin, end, other);
    else consume(p, sh, ring, hs, begin, end, bank);
}

// Two blocks pass a counter back and forth `hops` times (signal as a task does, wait as a
// task does): the time of one hop, signal to seen.
extern "C" __global__ void hop_kernel(int* counter, int hops) {
    if (threadIdx.x != 0) return;
    for (int i = blockIdx.x; i < hops; i += 2) {
        while (ld_acquire(counter) < i) {}
        fence_acq_rel();
        red_release_add(counter, 1);
    }
}
"""

BINDING_SOURCE = r"""
#include <cstring>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

void launch(torch::Tensor params, int64_t blocks, int64_t shared_bytes) {
    TORCH_CHECK(params.device().is_cpu() && params.scalar_type() == torch::kInt64 &&
                params.numel() * 8 == (int64_t)sizeof(Params), "params: int64 words of Params");
    Params p;
    std::memcpy(&p, params.data_ptr(), sizeof(Params));
    megakernel<<<blocks, THREADS, shared_bytes, c10::cuda::getCurrentCUDAStream()>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

int64_t prepare(int64_t shared_bytes) {  // the shared memory a block takes; blocks an SM holds
    C10_CUDA_CHECK(cudaFuncSetAttribute(megakernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)shared_bytes));
    int blocks = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, megakernel, THREADS,
                                                                 shared_bytes));
    return blocks;
}

void hop(torch::Tensor counter, int64_t hops) {
    hop_kernel<<<2, 32, 0, c10::cuda::getCurrentCUDAStream()>>>(counter.data_ptr<int>(), (int)hops);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}
"""
BINDING_DECLARATIONS = """
void launch(torch::Tensor params, int64_t blocks, int64_t shared_bytes);
int64_t prepare(int64_t shared_bytes);
void hop(torch::Tensor counter, int64_t hops);
"""


def ring_slots_for(shape: MegaShape, arch: str) -> int:
    """The ring's depth: as many 16-row slots as the block's shared memory holds beside the
    staged activations, at most 8 (on sm_90 the producer then runs about a layer ahead)."""
    slot = dynamic_shared_bytes(shape, 1) - dynamic_shared_bytes(shape, 0)
    room = SHARED_BYTES[arch] - STATIC_MARGIN - dynamic_shared_bytes(shape, 0)
    return max(1, min(8, room // slot))


def dynamic_shared_bytes(shape: MegaShape, ring_slots: int) -> int:
    """The ring's slots and the staged activations, rows of max_klen + 8 halves."""
    return (ring_slots * TILE_ROWS + ROWS) * (shape.max_klen + 8) * 2


def kernel_source(shape: MegaShape, consumer_warps: int = 4, ring_slots: int = 8,
                  dtype: torch.dtype = torch.float16) -> str:  # fmt: skip
    """The CUDA source for a shape, the compiled knobs and the element type (float16 or
    bfloat16): constants, `Params` (from PARAMS), then CUDA_SOURCE. Plain CUDA (no torch
    headers), so nvcc alone compiles it."""
    if dtype not in ELEMENT_TYPES:
        raise ValueError(f"megakernel: {dtype} is not one of {', '.join(map(str, ELEMENT_TYPES))}")
    assert TILE_ROWS * ROWS <= 32 * consumer_warps, "the epilogues take a thread an output"
    consts = dict(
        HIDDEN=shape.hidden, HEADS=shape.heads, KV_HEADS=shape.kv_heads,
        HEAD_DIM=shape.head_dim, INTER=shape.inter, DOWN_CHUNK=shape.down_chunk,
        MAX_KLEN=shape.max_klen, TILE_ROWS=TILE_ROWS, ROWS=ROWS, PAIRS=PAIRS,
        ATTN_BLOCK=ATTN_BLOCK, CONSUMER_WARPS=consumer_warps, RING_SLOTS=ring_slots,
        SYNC_HEADER=SYNC_HEADER, ERROR_WORDS=ERROR_WORDS, DONE_COUNTER=DONE,
        NO_COUNTER=NONE, PARAM_WORDS=len(PARAMS), LAYER_POINTER_COUNT=len(LAYER_POINTERS),
        PROFILE_STAMPS=len(STAMPS),
        **{f"OP_{op.name}": int(op) for op in Op},
        **{f"LP_{name.upper()}": i for i, name in enumerate(LAYER_POINTERS)},
    )  # fmt: skip
    lines = ["#include <cuda_fp16.h>", "#include <cuda_bf16.h>", "#include <cstdio>"]
    lines += [f"#define {k} {v}" for k, v in consts.items()]
    lines.append(f"#define ELEM_BF16 {int(dtype == torch.bfloat16)}")
    lines.append(ELEMENT_SOURCE)
    lines.append(f"#define WATCHDOG_CYCLES {WATCHDOG_CYCLES}LL")
    lines.append(f"struct Task {{ int {', '.join(FIELDS)}; }};  // a descriptor: two int4")
    lines.append("struct Params {")
    lines += [f"    {ctype} {name};" for name, ctype in PARAMS]
    lines.append("};")
    return "\n".join(lines) + "\n" + CUDA_SOURCE


def nvcc_flags(arch: str) -> list:
    """The flags `build` compiles with, less torch's own (cpp_extension adds those)."""
    return ["-O3", f"-gencode=arch=compute_{arch},code=sm_{arch}"]


def ptxas_report(
    shape: MegaShape,
    arch: str,
    consumer_warps: int = 4,
    ring_slots: int | None = None,
    dtype: torch.dtype = torch.float16,
) -> dict:
    """What ptxas says of the kernel for `arch` (nvcc on PATH, no GPU needed), compiled as
    `build` compiles it: registers a thread, spill bytes, stack bytes (the watchdog's printf
    arguments), static and dynamic shared memory. Raises with nvcc's output if it fails."""
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

    ring_slots = ring_slots or ring_slots_for(shape, arch)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "megakernel.cu"
        path.write_text(kernel_source(shape, consumer_warps, ring_slots, dtype))
        out = subprocess.run(
            ["nvcc", *nvcc_flags(arch), *COMMON_NVCC_FLAGS, "-Xptxas", "-v", "-c", str(path),
             "-o", str(Path(tmp) / "megakernel.o")], capture_output=True, text=True,
        )  # fmt: skip
    if out.returncode:
        raise RuntimeError(f"nvcc failed for sm_{arch}:\n{out.stderr[-4000:]}")
    entry = out.stderr.split("Compiling entry function 'megakernel'")[1]
    entry = entry.split("Compiling entry function")[0]

    def number(pattern: str) -> int:
        found = re.search(pattern, entry)
        return int(found.group(1)) if found else 0

    return {
        "arch": f"sm_{arch}", "ring_slots": ring_slots, "consumer_warps": consumer_warps,
        "registers": number(r"Used (\d+) registers"),
        "spill_bytes": number(r"(\d+) bytes spill stores") + number(r"(\d+) bytes spill loads"),
        "stack_bytes": number(r"(\d+) bytes stack frame"),
        "static_shared_bytes": number(r"(\d+) bytes smem"),
        "dynamic_shared_bytes": dynamic_shared_bytes(shape, ring_slots),
    }  # fmt: skip


def build(
    shape: MegaShape,
    arch: str = "90",
    consumer_warps: int = 4,
    ring_slots: int | None = None,
    build_dir: str | None = None,
    verbose: bool = False,
    dtype: torch.dtype = torch.float16,
):
    """The compiled extension (`launch`, `prepare`, `hop`), cached under a name hashed from
    its source and flags (the shape, knobs and arch are in them)."""
    from torch.utils.cpp_extension import load_inline

    ring_slots = ring_slots or ring_slots_for(shape, arch)
    source = kernel_source(shape, consumer_warps, ring_slots, dtype) + BINDING_SOURCE
    flags = nvcc_flags(arch)
    name = "mega_" + hashlib.sha256((source + " ".join(flags)).encode()).hexdigest()[:16]
    module = load_inline(
        name=name, cpp_sources=BINDING_DECLARATIONS, cuda_sources=source,
        functions=["launch", "prepare", "hop"], extra_cuda_cflags=flags,
        build_directory=build_dir, verbose=verbose,
    )  # fmt: skip
    return module, ring_slots


@dataclasses.dataclass
class StepInputs:
    """What a decode step reads, as the megakernel takes it (`step_inputs`)."""

    x: torch.Tensor  # [rows, hidden], the embedded tokens
    layers: list  # each layer's LayerWeights (fused QKV and gate-up)
    k_pools: list  # each layer's [slots, kv_heads, head_dim]
    v_pools: list
    cos: torch.Tensor  # [max_positions, head_dim / 2]
    sin: torch.Tensor
    positions: torch.Tensor  # [rows] int64
    write_index: torch.Tensor  # [rows] int64: the slot each row's new key and value go to
    kv_lens: torch.Tensor  # [rows] int64
    table: torch.Tensor  # [rows, width] int32: blocks, or (block_size 0) each row's first slot
    block_size: int
    eps: float
    scale: float  # softmax scale, 1 / sqrt(head_dim)


class StepRecorder:
    """A layer stack that runs `stack` and keeps its last decode step's arguments (x,
    positions, plan): the step as run_fused_stack gets it, for the megakernel to run too."""

    def __init__(self, stack):
        self.stack, self.last = stack, None

    def __call__(self, engine, x, positions, plan, batch):
        if batch is None:
            self.last = (x, positions, plan)
        return self.stack(engine, x, positions, plan, batch)


def step_inputs(engine, x, positions, plan) -> StepInputs:
    """A decode step's inputs as run_fused_stack(engine, x, positions, plan, None) gets them."""
    cache = engine.cache
    return StepInputs(
        x=x, layers=engine.weights.layers, k_pools=list(cache.k), v_pools=list(cache.v),
        cos=engine.rope.cos,
        sin=engine.rope.sin, positions=positions, write_index=plan.write_index,
        kv_lens=plan.kv_lens, table=plan.table,
        block_size=0 if cache.table_offsets else cache.kernel_block_size,
        eps=engine.spec.rms_norm_eps, scale=engine.attention.scale,
    )  # fmt: skip


class Megakernel:
    """A built kernel bound to a schedule, with the step's buffers and counters (zeroed once:
    each step zeroes the bank the next one uses). `__call__(inputs)` queues one step on the
    current stream and returns x after the last layer (a view of a buffer the next call
    overwrites); it allocates nothing, so a CUDA graph can capture it after a first call."""

    def __init__(self, module, schedule: Schedule, ring_slots: int, device,
                 split_tokens: int = SPLIT_TOKENS, spin_ns: int = SPIN_NS,
                 profile: bool = False, dtype: torch.dtype = torch.float16):  # fmt: skip
        """`dtype`: the element type `module` was built for (`build`'s)."""
        s, rows, dev = schedule.shape, ROWS, torch.device(device)
        self.module, self.schedule, self.split_tokens = module, schedule, split_tokens
        self.dtype = dtype
        self.spin_ns = spin_ns
        # profile: each task's STAMPS (ns, the GPU's global timer), queue after queue
        n_tasks = sum(len(q) for q in schedule.queues)
        self.stamps = torch.zeros(n_tasks, len(STAMPS), dtype=torch.int64, device=dev) if (
            profile) else None  # fmt: skip
        self.shared_bytes = dynamic_shared_bytes(s, ring_slots)
        if module.prepare(self.shared_bytes) < 1:
            raise RuntimeError(f"megakernel: a block of {self.shared_bytes} bytes does not fit")
        offsets, tasks = schedule.tensors()
        self.queue, self.tasks = offsets.to(dev), tasks.to(dev)
        self.sync = torch.zeros(SYNC_HEADER + 2 * len(schedule.counters), dtype=torch.int32,
                                device=dev)  # fmt: skip
        self.error = torch.zeros(ERROR_WORDS, dtype=torch.int32, pin_memory=True)
        half, fp32 = dict(dtype=dtype, device=dev), dict(dtype=torch.float32, device=dev)
        L, splits = s.layers, schedule.attn_splits
        self.buffers = dict(
            xs=torch.empty(L, rows, s.hidden, **half), xmid=torch.empty(L, rows, s.hidden, **half),
            q=torch.empty(L, rows, s.q_dim, **half), o=torch.empty(L, rows, s.q_dim, **half),
            act=torch.empty(L, rows, s.inter, **half),
            part_o=torch.empty(s.heads, rows, s.hidden, **fp32),
            part_down=torch.empty(s.inter // s.down_chunk, rows, s.hidden, **fp32),
            attn_m=torch.empty(rows, s.heads, splits, **fp32),
            attn_l=torch.empty(rows, s.heads, splits, **fp32),
            attn_acc=torch.empty(rows, s.heads, splits, s.head_dim, **fp32),
        )  # fmt: skip
        self._pointers: tuple = ((), None)

    def layer_pointers(self, inputs: StepInputs) -> torch.Tensor:
        """[layers, 8] int64 device table of LAYER_POINTERS, remade when a pointer moves."""
        rows = [
            [w.input_norm, w.qkv[0], w.o, w.post_norm, w.gate_up[0], w.down, k, v]
            for w, k, v in zip(inputs.layers, inputs.k_pools, inputs.v_pools)
        ]
        key = tuple(t.data_ptr() for row in rows for t in row)
        if key != self._pointers[0]:
            for t in (t for row in rows for t in row[:6]):  # cp.async moves 16-byte pieces
                assert t.dtype == self.dtype and t.is_contiguous() and t.data_ptr() % 16 == 0
            table = torch.tensor(key, dtype=torch.int64).view(len(rows), len(LAYER_POINTERS))
            self._pointers = (key, table.to(self.tasks.device))
        return self._pointers[1]

    def params(self, inputs: StepInputs) -> torch.Tensor:
        """The kernel's Params as int64 words (PARAMS' order)."""
        s, x, k, v = self.schedule.shape, inputs.x, inputs.k_pools[0], inputs.v_pools[0]
        rows = x.shape[0]
        assert rows == self.schedule.rows and x.shape[1] == s.hidden and x.is_contiguous()
        assert x.dtype == self.dtype and k.dtype == self.dtype and inputs.cos.dtype == self.dtype
        for t in (inputs.positions, inputs.write_index, inputs.kv_lens):
            assert t.dtype == torch.int64 and t.shape == (rows,) and t.is_contiguous()
        assert inputs.table.dtype == torch.int32 and inputs.table.stride(-1) == 1
        assert k.stride(-1) == 1 and v.stride(-1) == 1 and inputs.cos.stride(-1) == 1
        b = self.buffers
        values = dict(
            queue=self.queue, tasks=self.tasks, sync=self.sync, error=self.error,
            layer_ptrs=self.layer_pointers(inputs), x_in=x, **b, cos=inputs.cos, sin=inputs.sin,
            positions=inputs.positions, write_index=inputs.write_index, kv_lens=inputs.kv_lens,
            table=inputs.table, n_counters=len(self.schedule.counters), rows=rows,
            attn_splits=self.schedule.attn_splits, split_tokens=self.split_tokens,
            block_size=inputs.block_size, table_stride=inputs.table.stride(0),
            rope_stride=inputs.cos.stride(0), k_stride_token=k.stride(0),
            k_stride_head=k.stride(1), v_stride_token=v.stride(0), v_stride_head=v.stride(1),
            eps=inputs.eps, qk_scale_log2=inputs.scale * math.log2(math.e),
            prof=self.stamps, spin_ns=self.spin_ns,
        )  # fmt: skip
        words = []
        for name, ctype in PARAMS:
            value = values[name]
            if value is None:  # a pointer left out: the kernel skips what it would write
                words.append(0)
            elif isinstance(value, torch.Tensor):
                words.append(value.data_ptr())
            elif ctype == "double":
                words.append(struct.unpack("<q", struct.pack("<d", value))[0])
            else:
                words.append(int(value))
        return torch.tensor(words, dtype=torch.int64)

    def __call__(self, inputs: StepInputs) -> torch.Tensor:
        self.module.launch(self.params(inputs), self.schedule.blocks, self.shared_bytes)
        return self.buffers["xs"][-1, : inputs.x.shape[0]]

    def stuck_task(self) -> str | None:
        """The watchdog's report after a trapped launch (the error words are in pinned host
        memory, readable after the context is lost), or None."""
        e = self.error.tolist()
        if not e[0]:
            return None
        block, index, op, layer, tile, split, counter, target, seen = e[1:]
        name = self.schedule.counters[counter] if 0 <= counter < len(self.schedule.counters) else (
            "its weight slot")  # fmt: skip
        return (f"block {block} task {index}: {Op(op).name}(layer {layer}, tile {tile}, split "
                f"{split}) waited for {name} to reach {target}, at {seen}")  # fmt: skip

    def profile(self) -> dict:
        """The last step's profile (a Megakernel made with profile=True): profile_summary of
        its tasks' stamps."""
        assert self.stamps is not None, "made without profile=True"
        placed = [(block, t) for block, q in enumerate(self.schedule.queues) for t in q]
        return profile_summary(placed, self.stamps.tolist())


def profile_summary(placed: list, stamps: list) -> dict:
    """Where a step's time goes, from each task's STAMPS (ns): `placed` is (block, Task) in the
    kernel's order (queue after queue). Per op the medians and totals of its tasks' phases:
    `wait` (for its counter), `weights` (for its ring slot once ready), `work` (compute, store,
    signal); per layer its span (its first task's start to its last one's end); per block its
    busy share (work over the step); the step's span."""
    t0 = min(row[0] for row in stamps)
    end = max(row[3] for row in stamps)
    ops: dict = {}
    layers: dict = {}
    busy: dict = {}
    for (block, task), (start, ready, weights, done) in zip(placed, stamps):
        phases = {"wait": ready - start, "weights": weights - ready, "work": done - weights}
        entry = ops.setdefault(task.op.name, {k: [] for k in phases})
        for k, v in phases.items():
            entry[k].append(v)
        span = layers.setdefault(task.layer, [start, done])
        span[0], span[1] = min(span[0], start), max(span[1], done)
        busy[block] = busy.get(block, 0) + phases["work"]

    def us(values: list) -> float:
        return round(statistics.median(values) / 1e3, 3)

    step_ns = max(end - t0, 1)
    return {
        "step_us": round(step_ns / 1e3, 2),
        "ops": {
            name: {
                "tasks": len(p["work"]),
                **{f"{k}_us": us(v) for k, v in p.items()},
                "work_total_us": round(sum(p["work"]) / 1e3, 1),
            }
            for name, p in ops.items()
        },  # fmt: skip
        "layer_span_us": [round((s[1] - s[0]) / 1e3, 2) for _, s in sorted(layers.items())],
        "layer_start_us": [round((s[0] - t0) / 1e3, 2) for _, s in sorted(layers.items())],
        "busy_share": {
            "median": round(statistics.median(busy.values()) / step_ns, 3),
            "max": round(max(busy.values()) / step_ns, 3),
        },
    }
