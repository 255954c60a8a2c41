"""How the split-K decode attention (`decode_attention.py`) is launched on each GPU: its splits
a row and the graphs' context buckets, its tiles, how it holds a head, and a register cap. Each
rule names the measurement behind it (the H200, docs/PERF.md); on GPUs where nothing was
measured the rules keep the first defaults."""

import triton

from variants.kernels.prefill_attention import head_parts

# Past this many tokens, a graph's context bucket gives few rows more, shorter splits.
LONG_CONTEXT = 1024


def graph_context_buckets(max_positions: int, capability=(0, 0)) -> list:
    """The context buckets the decode graphs capture the split-K grid at: on Hopper up to
    LONG_CONTEXT and the rest (`choose_num_splits`); elsewhere one."""
    if tuple(capability) >= (9, 0) and max_positions > LONG_CONTEXT:
        return [LONG_CONTEXT, max_positions]
    return [max_positions]


def choose_num_splits(
    max_kv_len: int, batch: int, kv_heads: int, sm_count: int, capability=(0, 0)
) -> int:
    """The grid's splits for contexts up to max_kv_len (a graph's bucket): enough (row, kv
    head, split) programs to fill about 16x the SMs, at most one per 64 tokens of the bucket,
    at most 16. How many of them work follows each row's live length in the kernel
    (SPLIT_TOKENS). With 32-token tiles at 64 rows x 2048 tokens on the H200, 16 splits read
    the cache at 1.77-1.88 TB/s and 2-3 splits at 1.4-1.7; with 128-token tiles of four warps,
    2-16 splits all read 2.4-2.7 TB/s; with Hopper's 32-token tiles of one warp now, 4-8 splits
    read 3.06-3.08 TB/s, and 9 splits 3.35 with the head in two parts
    (scripts/tune_decode_attention.py, docs/PERF.md, runs 90 and 93).
    On Hopper past LONG_CONTEXT, below a quarter of an SM a (row, kv head) program (1-8 rows
    at 4 kv heads), up to 64 splits, as many as fit in one wave: 6 programs an SM with the
    two-warp tiles (1-4 rows: 64, 64, 64, 49 splits), 8 with the one-warp tiles of 5-8 rows
    (`default_tiles`; 8 rows: 33). The decode step on the H200 (docs/PERF.md, runs 104-105 and
    110, us, 16 splits -> 64 or 33): 1 x 1100 425 -> 357, 1 x 1500 461 -> 362, 4 x 1500 500 ->
    442, 1 x 2048 557 -> 392, 4 x 2048 613 -> 481, 8 x 2048 711 -> 638. At 4 rows 64 splits of
    two warps (146 registers, 6 programs an SM) outgrow one wave once more than about 800 of
    them work, and the step jumps (runs 112 and 114, 64 -> 49 splits: 4 x 1800 517 -> 466, 4 x
    2000 522 -> 483, 4 x 2800 603 -> 550, 4 x 4000 698 -> 635; 4 x 2048 482 -> 486, 4 x 3100
    540 -> 558, where 64 happen to fit). Those grids cost
    11-16 us a step at short contexts (8 x 150 334 -> 345, 1 x 150 300 -> 316, 4 x 1000 424 ->
    439), so the decode graphs capture a bucket that ends at LONG_CONTEXT
    (`graph_context_buckets`), whose 1024 tokens still give 16 splits. Other GPUs keep the rule
    above: nothing was measured there."""
    programs = max(1, batch * kv_heads)
    wanted = -(-16 * sm_count // programs)
    splits = max(1, min(16, wanted, max_kv_len // 64))
    if long_context_rule(max_kv_len, programs, sm_count, capability):
        per_sm = 8 if one_warp_long_tiles(programs, sm_count) else 6
        splits = max(splits, min(64, per_sm * sm_count // programs, max_kv_len // 32))
    return splits


def long_context_rule(max_kv_len: int, programs: int, sm_count: int, capability=(0, 0)) -> bool:
    """Whether (row, kv head) `programs` at contexts up to max_kv_len take the long-context
    splits: Hopper, past LONG_CONTEXT, below a quarter of an SM a program."""
    return tuple(capability) >= (9, 0) and max_kv_len > LONG_CONTEXT and 4 * programs < sm_count


def one_warp_long_tiles(programs: int, sm_count: int) -> bool:
    """Whether the long-context splits of `programs` (row, kv head) programs take 16-token
    tiles of one warp (from a sixth of an SM a program: 8 rows at 4 kv heads) rather than two."""
    return 6 * programs >= sm_count


# The fewest live tokens a split gets with tiles of 32 tokens or more. At 8 x 150 on the H200
# (16 splits captured) 32 tokens took the attention from 10.4 to 7.3 us; at 64 x 2048 it made no
# difference (docs/PERF.md). 16-token tiles split at 16 tokens (`split_tokens_for`).
SPLIT_TOKENS = 32


def split_tokens_for(block_n: int) -> int:
    """The default fewest live tokens a split gets with BLOCK_N-token tiles: a split works at
    least one whole tile."""
    return min(SPLIT_TOKENS, block_n)


def long_split_programs(batch: int, kv_heads: int, sm_count: int, capability=(0, 0)) -> int:
    """How many working (row, kv head, split) programs let a split grow from 32 to 64 or 128
    tokens (0: splits never grow). Hopper from a (row, kv head) program per SM (the 32-token
    tiles of one warp): five programs an SM. The decode step on the H200 (docs/PERF.md, runs
    101-103, us, by the programs that work): 40 x 260 in 32-, 64- and 128-token splits (1440,
    800 and 480 programs) 583 / 569 / 608-613; 64 x 260 (2304, 1280, 768) 671 / 652 / 643; 48
    x 388 in 64- and 128-token splits (1344, 768) 712 / 697; 48 x 516 (1728, 960) 748 / 731.
    From 1152 tokens the grid's 9 splits bind and the split length does not change; there the
    rule's read of every row's length costs about 10 us a step (64 x 1024: 1141 -> 1150, 1152
    -> 1163)."""
    if tuple(capability) >= (9, 0) and batch * kv_heads >= sm_count:
        return 5 * sm_count
    return 0


def default_prefetch_tiles(batch: int, kv_heads: int, num_splits: int, capability=(0, 0)) -> int:
    """Tiles of its keys and values a split prefetches into L2 before its PDL wait: two; one in
    Hopper's long-context grids (more than 16 splits) from 8 (row, kv head) programs up (2 rows
    at 4 kv heads). The decode step on the H200 (docs/PERF.md, runs 129-131, step graph us, two
    tiles -> one): 4 x 2048 484 -> 477, 3 x 2048 488 -> 481, 2 x 3000 441 -> 434, 4 x 1100 413
    -> 408, 8 x 1500 520 -> 515, 8 x 2048 577 -> 572; at 1 row two tiles win (1 x 2048 387 ->
    392, 1 x 1100 347 -> 353), and in the short grids (32 x 512 647 -> 652; none: 666)."""
    if tuple(capability) >= (9, 0) and num_splits > 16 and batch * kv_heads >= 8:
        return 1
    return 2


def default_parts(d: int, batch: int, kv_heads: int, sm_count: int, capability=(0, 0)):
    """(DA, DB): how the kernel cuts a head of d dimensions. Hopper from a quarter of an SM a
    (row, kv head) program up: two power-of-two parts (`head_parts`, 192 = 128 + 64), no
    padding in registers (H200, docs/PERF.md: the decode step at 64 x 2048 1851 -> 1765 us, 64
    x 256 720 -> 687, the cache read at 64 x 2048 3.08 -> 3.35 TB/s, run 93; 32 x 512 669 ->
    649, 32 x 100 443 -> 436, 24 x 300 530 -> 526, 16 x 100 a tie, run 95). Otherwise one part
    padded to a power of two: at 1-8 rows the cut cost 2-4% of a step (8 x 150 334 -> 340 us,
    8 x 1000 490 -> 510, run 93)."""
    programs = batch * kv_heads
    if tuple(capability) >= (9, 0) and 4 * programs >= sm_count:
        return head_parts(d)
    return max(16, triton.next_power_of_2(d)), 0


def default_tiles(
    batch: int, kv_heads: int, block_d: int, sm_count: int, capability=(0, 0), num_splits: int = 1
):
    """(BLOCK_N, warps, stages) for a grid of `num_splits` splits.
    - Narrow heads (BLOCK_D <= 64): 64-token tiles, four warps.
    - Hopper and newer (measured on the H200, docs/PERF.md):
      - 32-token tiles (and splits of 32 tokens) of one warp once there is a (row, kv head)
        program per SM: the whole decode step at 64 x 2048 took 1852 us against 2211 with the
        128-token tiles of four warps, 64 x 256 722 against 875, 48 x 512 800 against 904 (run
        88; 128-token tiles of two warps, or 64-token ones of one, were 2-8x slower);
      - below that, 16-token tiles (and splits of 16 tokens): more splits work, and each
        split's chain is one short tile. One warp a program from a quarter of an SM a program
        up (the whole decode step at 32 x 512: 703 us against 871 with 64-token tiles of four
        warps; 16 x 1000: 589 against 709), two warps below (8 x 40: 314 against 320; 1 x 150:
        300 against 311; 8 x 1000: 493 against 513), runs 81-83;
      - with the long-context splits (more than 16), one warp again from a sixth of an SM a
        program (8 rows at 4 kv heads, 33 splits; the whole decode step, run 110: 8 x 1100 531
        -> 513, 8 x 1500 573 -> 546, 8 x 2048 642 -> 613, 8 x 3100 773 -> 742). At 1-4 rows
        two warps stay (64 splits; 49 at 4 rows): 1 x 4000 432 against 462, 1 x 1500 362
        against 380 (run 113), 4 x 2048 at 49 splits 486 against 505 with 64 of one warp (run
        112), though past 3300 tokens one warp wins at 4 rows (4 x 4000 635 against 603).
    - Other GPUs keep 32-token tiles of four warps: nothing else was measured there (an RTX
      3090 has the same registers a thread but 99 KiB of shared memory a block)."""
    if block_d <= 64:
        return 64, 4, 2
    programs = batch * kv_heads
    if tuple(capability) >= (9, 0):
        if programs >= sm_count:
            return 32, 1, 2
        long_one_warp = num_splits > 16 and one_warp_long_tiles(programs, sm_count)
        if 4 * programs >= sm_count or long_one_warp:
            return 16, 1, 2
        return 16, 2, 2
    return 32, 4, 2


def default_max_registers(
    tiles: tuple, batch: int, kv_heads: int, num_splits: int, sm_count: int, capability=(0, 0)
) -> int | None:
    """A register cap for ptxas (Triton's `maxnreg`), or None to leave it its own count.
    Hopper's 16-token tiles below a quarter of an SM a (row, kv head) program, in a grid of at
    most 8 warps an SM: 168. Given that cap, above what it picks alone, ptxas takes more
    registers for these builds (Triton 3.6: 102 -> 142 at 16 splits of two warps, 146 -> 144
    at 64, 154 -> 168 at 33 splits of one warp) and the step runs faster (H200, docs/PERF.md,
    run 115, step graph us: 8 x 40 312.9 -> 310.2, 1 x 150 299.0 -> 293.2, 4 x 1000 423.6 ->
    405.2, 1 x 1500 360.1 -> 353.6, 2 x 3000 447.9 -> 436.4, 8 x 1200 525.4 -> 497.1, 8 x 2048
    612.5 -> 576.2, 8 x 3100 740.0 -> 680.5). A fuller grid loses: 4 rows' 49 splits of two
    warps (12 warps an SM) at 112 -> 140 registers, 4 x 1300 420.9 -> 441.8, 4 x 2048 483.1 ->
    492.1; from a quarter of an SM a program up it does not pay (run 114, capped at 168 / 200:
    32 x 512 647 -> 647 / 704, 64 x 256 646 -> 661 / 656)."""
    programs = batch * kv_heads
    if tuple(capability) < (9, 0) or tiles[0] != 16 or 4 * programs >= sm_count:
        return None
    return 168 if tiles[1] * programs * num_splits <= 8 * sm_count else None
