"""Tile choice of the few-row kernels (the jitted loop itself is tested through its kernels)."""

import pytest

pytest.importorskip("triton", reason="triton is not installed")

from variants.kernels.row_dot import SHARED_MEMORY_BUDGET, few_row_tiles, norm_chunks  # noqa: E402


def _staged(tiles, weight_tiles):
    block_m, block_n, block_k, _, stages = tiles
    return 2 * stages * block_k * (block_m + weight_tiles * block_n)


def test_h200_decode_shapes_get_the_measured_default():
    assert few_row_tiles(8, 1152, 132, weight_tiles=2) == (16, 16, 256, 4, 3)  # QKV pairs
    assert few_row_tiles(1, 4096, 132) == (16, 16, 256, 4, 3)  # the head: 256 column tiles
    assert few_row_tiles(33, 768, 132) == (64, 16, 256, 4, 2)  # 64 rows: two stages fit


def test_column_tiles_widen_while_every_sm_keeps_a_program():
    assert few_row_tiles(8, 4096, 64)[1] == 64
    assert few_row_tiles(8, 4096, 82)[1] == 32  # an RTX 3090: 128 tiles of 32 columns


@pytest.mark.parametrize("rows,cols,sms,weights,prefer", [
    (64, 1152, 4, 2, None), (64, 3072, 132, 2, (32, 256, 8, 3)), (16, 3072, 132, 2, (32, 64, 4, 6)),
])  # fmt: skip
def test_staged_tiles_fit_an_rtx_3090(rows, cols, sms, weights, prefer):
    tiles = few_row_tiles(rows, cols, sms, weight_tiles=weights, prefer=prefer)
    assert _staged(tiles, weights) <= SHARED_MEMORY_BUDGET
    if prefer == (32, 64, 4, 6):
        assert tiles == (16, 32, 64, 4, 6)  # fits as preferred: unchanged
    if prefer == (32, 256, 8, 3):
        assert tiles == (64, 32, 128, 8, 2)  # two stages, then 128-wide chunks


def test_norm_chunks_cover_the_reduction_or_are_zero_without_a_norm():
    assert norm_chunks(768, 256) == 3
    assert norm_chunks(768, 64) == 12
    assert norm_chunks(770, 256) == 4  # a ragged last chunk is masked in the kernel
    assert norm_chunks(768, 256, norm=False) == 0
