"""The staging rule: how many chunks of its weight share a program loads before its PDL wait."""

import pytest

pytest.importorskip("triton", reason="triton is not installed")

from variants.kernels.staged_dot import (  # noqa: E402
    STAGE_BYTES,
    STAGED_TILES,
    default_stage,
    short_staged_tiles,
    stage_chunks,
)


def test_the_down_projection_at_a_few_rows_stages_its_three_chunks():
    # 16-row tile, 32 columns, 128-wide chunks, 4 warps; a split of 384 of K = 3072 (8 splits)
    assert stage_chunks(16, 32, 128, 4, 384, elem=2) == 3


def test_a_share_over_the_byte_budget_is_not_staged():
    # gate-up's pairs (two weight tiles) of 32 x 768 halves over 128 threads: 768 bytes a thread
    assert 2 * 2 * 32 * 768 // 128 > STAGE_BYTES
    assert stage_chunks(16, 32, 256, 4, 768, elem=2, weight_tiles=2) == 0
    assert stage_chunks(16, 32, 256, 8, 384, elem=2, weight_tiles=2) == 2  # 192 bytes
    # float32: twice the bytes of the same share
    assert stage_chunks(16, 32, 256, 4, 384, elem=2) == 2
    assert stage_chunks(16, 32, 256, 4, 384, elem=4) == 0


def test_x_counts_too_and_at_most_four_chunks_stage():
    assert stage_chunks(64, 16, 128, 4, 512, elem=2) == 0  # x: 64 x 512 halves, 512 bytes
    assert stage_chunks(16, 32, 64, 4, 768, elem=2, weight_tiles=2) == 0  # 12 chunks
    assert stage_chunks(16, 16, 64, 4, 256, elem=2) == 4
    assert stage_chunks(16, 16, 64, 4, 257, elem=2) == 0  # a fifth chunk


def test_staging_is_the_default_under_pdl_up_to_one_16_row_tile():
    assert [default_stage(True, rows) for rows in (1, 8, 16, 17, 32)] == [True] * 3 + [False] * 2
    assert not default_stage(False, 8)  # no wait to hide the loads behind


def test_short_reductions_stage_at_their_own_tiles_where_those_fit():
    assert STAGED_TILES == (32, 256, 8, 3)
    assert short_staged_tiles(16, 768, elem=2) == STAGED_TILES  # the output projection, head
    assert short_staged_tiles(16, 700, elem=2) == STAGED_TILES  # K rounds up to 3 chunks
    assert short_staged_tiles(16, 1536, elem=2) is None  # six chunks
    assert short_staged_tiles(64, 768, elem=2) == STAGED_TILES  # x: 384 bytes, the budget
    assert short_staged_tiles(64, 1024, elem=2) is None  # x: 512 bytes a thread
