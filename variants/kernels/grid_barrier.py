"""A barrier across every program of a persistent launch, for kernels that run several phases
(each reading what all programs wrote in the one before) in one launch.

Every program must be resident at once: launch at most one program an SM, each small enough to
fit (a program that cannot start would leave the others waiting for good; a GPU shared under
MPS with an SM limit is such a case).

Two int32 counters a launch, zero before it and left zero after it: `arrived` counts arrivals
over the launch's barriers (barrier n of a launch of P programs waits for n * P), and `left`
counts programs that reached the end; the last to leave zeroes both, when no program can still
be waiting. A program's stores land before its arrival (a block barrier, then a release at
GPU scope) and the waiting side acquires, so what others stored before the barrier is visible
after it. Spinning needs programs that run side by side: the Triton interpreter runs them one
after another, so kernels there run one phase a launch instead."""

import triton
import triton.language as tl


@triton.jit
def grid_barrier(counters_ptr, n):
    """Wait until every program has arrived at this launch's barrier number n (1, 2, ...)."""
    target = n * tl.num_programs(0)
    tl.debug_barrier()
    seen = tl.atomic_add(counters_ptr, 1, sem="acq_rel", scope="gpu") + 1
    while seen < target:
        seen = tl.atomic_add(counters_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def leave(counters_ptr):
    """The launch's last program to finish zeroes the counters for the next launch."""
    tl.debug_barrier()
    if tl.atomic_add(counters_ptr + 1, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
        tl.atomic_xchg(counters_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(counters_ptr + 1, 0, sem="relaxed", scope="gpu")
