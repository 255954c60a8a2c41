"""Split-K for the few-row projection kernels: the reduction over K is cut into SPLIT_K ranges,
each its own program, so a projection with few output tiles still puts a program on every SM and
more of its weight in flight at once. One launch does it all: each program stores its float32
partial, and the last program of an output tile to arrive (an arrival counter a tile, reset by
that program) sums the partials in split order (so the result does not depend on which program
came last) and runs the kernel's epilogue.

The counters live in one zeroed int32 buffer a device that every kernel leaves zero; the kernels
that use it run one after another on a stream (a decode step, a graph), never side by side."""

import functools

import torch
import triton
import triton.language as tl

MAX_TILES = 4096  # output tiles (column tiles x row tiles) a split launch may have


@functools.cache
def arrival_counters(device: torch.device) -> torch.Tensor:
    return torch.zeros(MAX_TILES, device=device, dtype=torch.int32)


def host_cdiv(a: int, b: int) -> int:
    """Ceiling division for launchers: triton.cdiv goes through the JIT's call path (slow in
    host time), which an eager decode step pays a few times a kernel."""
    return -(-a // b)


def split_range(k: int, block_k: int, splits: int) -> int:
    """The K elements a split covers: a whole number of BLOCK_K chunks, the last split shorter."""
    return host_cdiv(host_cdiv(k, splits), block_k) * block_k


def split_workspace(splits: int, rows: int, cols: int, device, pairs: int = 1) -> torch.Tensor:
    """Float32 partials [pairs, splits, rows, cols] (a placeholder when there is one split)."""
    if splits == 1:
        return torch.empty(1, device=device, dtype=torch.float32)
    return torch.empty(pairs, splits, rows, cols, device=device, dtype=torch.float32)


def counters_for(device, tiles: int) -> torch.Tensor:
    assert tiles <= MAX_TILES, f"{tiles} output tiles: a split launch holds at most {MAX_TILES}"
    return arrival_counters(torch.device(device))


@triton.jit
def store_partial(ws_ptr, split, offs_m, offs_n, mask, acc, M, N):
    """acc [BLOCK_M, BLOCK_N] into partials[split] ([splits, M, N] at ws_ptr)."""
    at = ws_ptr + (split * M + offs_m[:, None]).to(tl.int64) * N + offs_n[None, :]
    tl.store(at, acc, mask=mask)


@triton.jit
def arrive_last(counter_ptr, SPLIT_K: tl.constexpr):
    """True in the last program of a tile to arrive. Every thread's stores land first (a block
    barrier, then a release at GPU scope); the last acquires the others' stores."""
    tl.debug_barrier()
    last = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1
    return last


@triton.jit
def sum_partials(ws_ptr, offs_m, offs_n, mask, M, N, SPLIT_K: tl.constexpr):
    """The sum over splits 0..SPLIT_K-1 of partials [splits, M, N], in that order. The loads
    skip L1 (.cg): other programs wrote these rows."""
    tl.debug_barrier()
    total = tl.load(ws_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :], mask=mask,
                    other=0.0, cache_modifier=".cg")  # fmt: skip
    for s in tl.static_range(1, SPLIT_K):
        at = ws_ptr + (s * M + offs_m[:, None]).to(tl.int64) * N + offs_n[None, :]
        total += tl.load(at, mask=mask, other=0.0, cache_modifier=".cg")
    return total


@triton.jit
def tile_counter(counter_ptr):
    """The arrival counter of this program's output tile (grid axes 0 and 1; axis 2 is the
    split)."""
    return counter_ptr + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)


@triton.jit
def pair_partials(
    ws_ptr, split, counter, offs_m, offs_n, mask, a, b, M, N, SPLIT_K: tl.constexpr
):  # fmt: skip
    """Store split `split`'s partials of two results (partials [2, splits, M, N] at ws_ptr) and
    arrive. Returns (last, a, b): in the last program of the tile to arrive, the sums over the
    splits (it then runs the epilogue and resets the counter); elsewhere the inputs."""
    b_ws = ws_ptr + SPLIT_K * M * N
    store_partial(ws_ptr, split, offs_m, offs_n, mask, a, M, N)
    store_partial(b_ws, split, offs_m, offs_n, mask, b, M, N)
    last = arrive_last(counter, SPLIT_K)
    if last:
        a = sum_partials(ws_ptr, offs_m, offs_n, mask, M, N, SPLIT_K)
        b = sum_partials(b_ws, offs_m, offs_n, mask, M, N, SPLIT_K)
    return last, a, b


@triton.jit
def reset_counter(counter_ptr):
    tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")


LONG_K = 2048  # reductions at least this long split when the tiles leave SMs idle
# Their tiles: 32 columns, 128-wide chunks: the fastest for the down projection at 8 rows
# (K = 3072, 8 splits), ahead of 16 x 256 tiles (experiments/bench_few_row.py).
LONG_K_TILES = (32, 128, 4, 3)


def default_split_k(tiles: int, k: int, block_k: int, sm_count: int) -> int:
    """Splits for a launch of `tiles` output tiles over a K-long reduction in BLOCK_K chunks.
    Only long reductions (LONG_K) over fewer tiles than SMs split, into ranges of three chunks
    (the pipeline's stages) up to 768 long, up to two programs an SM. At 8 rows the down
    projection (K = 3072) runs faster split; the shorter reductions (K = 768: QKV, the output
    projection, gate-up, the head) lose to any split, the partials' round trip costing more
    than the shorter weight loop saves."""
    if k < LONG_K or tiles >= sm_count:
        return 1
    chunks = host_cdiv(k, block_k)
    span = min(768, 3 * block_k)
    return max(1, min(host_cdiv(k, span), host_cdiv(2 * sm_count, tiles), chunks))


def splits_for(asked: int | None, tiles: int, k: int, block_k: int, sm_count: int) -> int:
    """The split count a launch runs: `asked`, or `default_split_k` when None; at most one split
    a BLOCK_K chunk."""
    if asked is None:
        asked = default_split_k(tiles, k, block_k, sm_count)
    return max(1, min(int(asked), host_cdiv(k, block_k)))
