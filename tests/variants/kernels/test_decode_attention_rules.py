"""The decode attention's launch rules: splits, context buckets, tiles, head parts and the
register cap, per GPU capability and SM count (the H200's: 132 SMs, capability 9.0)."""

import pytest

pytest.importorskip("triton", reason="triton is not installed")

from variants.kernels.decode_attention_rules import (  # noqa: E402
    LONG_CONTEXT,
    choose_num_splits,
    default_max_registers,
    default_parts,
    default_prefetch_tiles,
    default_tiles,
    graph_context_buckets,
    long_split_programs,
)


def test_default_parts():
    hopper = (9, 0)
    assert default_parts(192, 64, 4, 132, hopper) == (128, 64)  # a program per SM: two parts
    assert default_parts(192, 16, 4, 132, hopper) == (128, 64)  # from a quarter of an SM a program
    assert default_parts(192, 8, 4, 132, hopper) == (256, 0)  # fewer: one padded part
    assert default_parts(128, 64, 4, 132, hopper) == (128, 0)
    assert default_parts(192, 64, 4, 82, (8, 6)) == (256, 0)  # not measured off Hopper


def test_long_split_programs():
    hopper = (9, 0)
    assert long_split_programs(64, 4, 132, hopper) == 660  # a program per SM: five an SM work
    assert long_split_programs(32, 4, 132, hopper) == 0  # fewer: splits keep their length
    assert long_split_programs(64, 4, 82, (8, 6)) == 0  # not measured off Hopper


def test_default_tiles():
    hopper = (9, 0)
    assert default_tiles(64, 4, 256, 132, hopper) == (32, 1, 2)  # a program per SM
    assert default_tiles(32, 4, 256, 132, hopper) == (16, 1, 2)  # from a quarter of that
    assert default_tiles(9, 4, 256, 132, hopper) == (16, 1, 2)
    assert default_tiles(8, 4, 256, 132, hopper) == (16, 2, 2)  # few rows: more splits work
    # the long-context splits: one warp again from a sixth of an SM a program
    assert default_tiles(8, 4, 256, 132, hopper, num_splits=33) == (16, 1, 2)
    assert default_tiles(6, 4, 256, 132, hopper, num_splits=44) == (16, 1, 2)
    assert default_tiles(5, 4, 256, 132, hopper, num_splits=53) == (16, 2, 2)
    assert default_tiles(4, 4, 256, 132, hopper, num_splits=64) == (16, 2, 2)
    assert default_tiles(8, 4, 256, 132, hopper, num_splits=16) == (16, 2, 2)
    assert default_tiles(8, 4, 256, 82, (8, 6), num_splits=33) == (32, 4, 2)
    assert default_tiles(64, 4, 256, 82, (8, 6)) == (32, 4, 2)  # not measured off Hopper
    assert default_tiles(8, 4, 64, 132, (8, 6)) == (64, 4, 2)  # narrow heads: always 64


def test_default_max_registers():
    """Hopper's 16-token tiles below a quarter of an SM a program, in a grid of at most 8 warps
    an SM: ptxas capped at 168 registers; nothing elsewhere."""
    hopper = (9, 0)
    assert default_max_registers((16, 2, 2), 8, 4, 16, 132, hopper) == 168  # 1024 warps
    assert default_max_registers((16, 2, 2), 1, 4, 64, 132, hopper) == 168
    assert default_max_registers((16, 1, 2), 8, 4, 33, 132, hopper) == 168  # 1056 warps
    assert default_max_registers((16, 2, 2), 4, 4, 49, 132, hopper) is None  # 1568 warps
    assert default_max_registers((16, 2, 2), 3, 4, 64, 132, hopper) is None  # 1536 warps
    assert default_max_registers((16, 1, 2), 9, 4, 16, 132, hopper) is None  # a quarter of an SM
    assert default_max_registers((32, 1, 2), 64, 4, 9, 132, hopper) is None
    assert default_max_registers((32, 4, 2), 8, 4, 16, 82, (8, 6)) is None


def test_default_prefetch_tiles():
    hopper = (9, 0)
    assert default_prefetch_tiles(4, 4, 49, hopper) == 1  # long_prompts' steps
    assert default_prefetch_tiles(2, 4, 64, hopper) == 1  # 8 programs
    assert default_prefetch_tiles(8, 4, 33, hopper) == 1
    assert default_prefetch_tiles(1, 4, 64, hopper) == 2  # one row keeps two
    assert default_prefetch_tiles(32, 4, 16, hopper) == 2  # the short grids keep two
    assert default_prefetch_tiles(8, 4, 16, hopper) == 2
    assert default_prefetch_tiles(4, 4, 49, (8, 6)) == 2


def test_choose_num_splits():
    assert choose_num_splits(150, 8, 4, 82) == 2  # short context: one split per 64 tokens
    assert choose_num_splits(63, 8, 4, 82) == 1
    assert choose_num_splits(2048, 1, 4, 82) == 16  # one long row: capped
    assert choose_num_splits(2048, 64, 4, 82) == 6  # 256 programs x 6 splits: over 16x 82 SMs
    assert choose_num_splits(4096, 64, 4, 132) == 9  # the graph's bucket at 64 rows, H200
    assert choose_num_splits(2048, 8, 4, 132) == 16  # 32 programs want 17 splits: capped
    assert choose_num_splits(512, 8, 4, 132) == 8  # at least 64 tokens a split
    assert choose_num_splits(1024, 8, 4, 132) == 16  # the short graph bucket keeps 16
    assert choose_num_splits(1, 1, 1, 132) == 1


def test_choose_num_splits_past_long_context():
    """On Hopper past LONG_CONTEXT (1024), below a quarter of an SM a (row, kv head) program,
    up to 64 splits, one wave of them: 6 programs an SM with two-warp tiles, 8 with the
    one-warp tiles from a sixth of an SM a program; a bucket that ends at 1024, and other
    GPUs, keep the rule above."""
    hopper = (9, 0)
    assert LONG_CONTEXT == 1024
    assert choose_num_splits(4096, 1, 4, 132, hopper) == 64
    assert choose_num_splits(4096, 2, 4, 132, hopper) == 64
    assert choose_num_splits(4096, 3, 4, 132, hopper) == 64  # 6 programs an SM: 66
    assert choose_num_splits(4096, 4, 4, 132, hopper) == 49  # 6 programs an SM: 49
    assert choose_num_splits(4096, 8, 4, 132, hopper) == 33  # one-warp tiles: 8 an SM
    assert choose_num_splits(4096, 16, 4, 132, hopper) == 16  # a quarter of an SM or more
    assert choose_num_splits(4096, 64, 4, 132, hopper) == 9
    assert choose_num_splits(1024, 4, 4, 132, hopper) == 16
    assert choose_num_splits(1025, 1, 4, 132, hopper) == 32  # 1025 // 32
    assert choose_num_splits(2100, 1, 4, 132, hopper) == 64  # 2100 // 32 = 65
    assert choose_num_splits(2100, 1, 4, 4, hopper) == 16  # 4 SMs: one program is a quarter
    assert choose_num_splits(4096, 4, 4, 82, (8, 6)) == 16
    assert choose_num_splits(4096, 4, 4, 132) == 16


def test_graph_context_buckets():
    assert graph_context_buckets(4096, (9, 0)) == [1024, 4096]
    assert graph_context_buckets(1025, (10, 0)) == [1024, 1025]
    assert graph_context_buckets(1024, (9, 0)) == [1024]
    assert graph_context_buckets(512, (9, 0)) == [512]
    assert graph_context_buckets(4096, (8, 6)) == [4096]
