"""How the split-K decode attention (`decode_attention.py`) is launched on each GPU: its splits
a row and the graphs' context buckets, its tiles, how it holds a head, and a register cap. The
Hopper rules follow the decode step's graph time per setting (experiments/step_tiles.py); on
GPUs where nothing was measured the rules keep the first defaults."""

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
    (SPLIT_TOKENS). At 64 rows x 2048 tokens, Hopper's 32-token tiles of one warp read the
    cache fastest in 9 splits with the head in two parts, nearly as fast in 4-8
    (experiments/tune_decode_attention.py).
    On Hopper past LONG_CONTEXT, below a quarter of an SM a (row, kv head) program (1-8 rows
    at 4 kv heads), up to 64 splits, as many as fit in one wave: 6 programs an SM with the
    two-warp tiles (1-4 rows: 64, 64, 64, 49 splits), 8 with the one-warp tiles of 5-8 rows
    (`default_tiles`; 8 rows: 33). There 16 splits are too few programs to fill the GPU: the
    longer grid wins from 1100 tokens. It must stay within one wave of its
    working programs: 64 splits of two warps (146 registers, 6 programs an SM) outgrow it at 4
    rows once more than about 800 of them work, hence 49 there. Those grids lose at short
    contexts, so the decode graphs capture a bucket that ends at LONG_CONTEXT
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


# The fewest live tokens a split gets with tiles of 32 tokens or more: at short contexts fewer
# splits work, each over whole tiles (the fastest at 8 x 150, 16 splits captured); at
# 64 x 2048 the split length does not matter. 16-token tiles split at 16 tokens
# (`split_tokens_for`).
SPLIT_TOKENS = 32


def split_tokens_for(block_n: int) -> int:
    """The default fewest live tokens a split gets with BLOCK_N-token tiles: a split works at
    least one whole tile."""
    return min(SPLIT_TOKENS, block_n)


def long_split_programs(batch: int, kv_heads: int, sm_count: int, capability=(0, 0)) -> int:
    """How many working (row, kv head, split) programs let a split grow from 32 to 64 or 128
    tokens (0: splits never grow). Hopper from a (row, kv head) program per SM (the 32-token
    tiles of one warp): five programs an SM. A split doubles (up to twice) while that many
    working programs remain at the longer length: fewer, longer splits win while the SMs stay
    that full (at 40-64 rows and 260-516 tokens), and lose below it.
    From 1152 tokens the grid's 9 splits bind and the split length does not change; there the
    rule's read of every row's length is pure cost."""
    if tuple(capability) >= (9, 0) and batch * kv_heads >= sm_count:
        return 5 * sm_count
    return 0


def default_prefetch_tiles(batch: int, kv_heads: int, num_splits: int, capability=(0, 0)) -> int:
    """Tiles of its keys and values a split prefetches into L2 before its PDL wait: two; one in
    Hopper's long-context grids (more than 16 splits) from 8 (row, kv head) programs up (2 rows
    at 4 kv heads): one tile wins there (2-8 rows past 1100 tokens). At 1 row, and in the
    short grids, two tiles win."""
    if tuple(capability) >= (9, 0) and num_splits > 16 and batch * kv_heads >= 8:
        return 1
    return 2


def default_parts(d: int, batch: int, kv_heads: int, sm_count: int, capability=(0, 0)):
    """(DA, DB): how the kernel cuts a head of d dimensions. Hopper from a quarter of an SM a
    (row, kv head) program up: two power-of-two parts (`head_parts`, 192 = 128 + 64), no
    padding in registers, which wins most at 64 x 2048 (a faster cache read); at 16 rows a
    tie. Otherwise one part padded to a power of two: at 1-8 rows the cut loses."""
    programs = batch * kv_heads
    if tuple(capability) >= (9, 0) and 4 * programs >= sm_count:
        return head_parts(d)
    return max(16, triton.next_power_of_2(d)), 0


def default_tiles(
    batch: int, kv_heads: int, block_d: int, sm_count: int, capability=(0, 0), num_splits: int = 1
):
    """(BLOCK_N, warps, stages) for a grid of `num_splits` splits.
    - Narrow heads (BLOCK_D <= 64): 64-token tiles, four warps.
    - Hopper and newer (by whole decode steps):
      - 32-token tiles (and splits of 32 tokens) of one warp once there is a (row, kv head)
        program per SM: faster at 48-64 rows than 128-token tiles of four warps;
      - below that, 16-token tiles (and splits of 16 tokens): more splits work, and each
        split's chain is one short tile. One warp a program from a quarter of an SM a program
        up (fewer registers, more programs resident), two warps below;
      - with the long-context splits (more than 16), one warp again from a sixth of an SM a
        program (8 rows at 4 kv heads, 33 splits). At 1-4 rows two warps
        stay (64 splits; 49 at 4 rows), though past 3300 tokens one warp would win at 4 rows.
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
    registers for these builds (scripts/compile_check.py reports them) and the step is
    faster: at 168 registers 12 warps fit an SM, so the grid still fits one wave.
    A fuller grid loses (4 rows' 49 splits of two warps, 12 warps an SM), and from a quarter of
    an SM a program up the cap does not pay."""
    programs = batch * kv_heads
    if tuple(capability) < (9, 0) or tiles[0] != 16 or 4 * programs >= sm_count:
        return None
    return 168 if tiles[1] * programs * num_splits <= 8 * sm_count else None
