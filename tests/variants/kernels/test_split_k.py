"""The split-K rule and ranges (the split launches themselves are tested through their kernels)."""

import pytest

pytest.importorskip("triton", reason="triton is not installed")

from variants.kernels.split_k import default_split_k, split_range, splits_for  # noqa: E402


def test_the_down_projection_splits_in_four_on_the_h200_and_an_rtx_3090():
    assert default_split_k(48, 3072, 256, 132) == 4  # 48 column tiles, 12 chunks: 192 programs
    assert default_split_k(48, 3072, 256, 82) == 4


@pytest.mark.parametrize("tiles,k", [(48, 768), (144, 768), (96, 768), (256, 768), (192, 3072)])
def test_short_reductions_and_full_grids_do_not_split(tiles, k):
    assert default_split_k(tiles, k, 256, 132) == 1


def test_splits_stop_at_two_programs_an_sm_and_at_the_chunks():
    assert default_split_k(100, 8192, 256, 132) == 3  # 300 programs would be too many
    assert default_split_k(8, 2048, 1024, 132) == 2  # two 1024-wide chunks


def test_split_ranges_are_whole_chunks_covering_k():
    assert split_range(3072, 256, 4) == 768
    assert split_range(768, 256, 2) == 512  # 512 + 256
    assert split_range(100, 32, 3) == 64  # 64 + 36, the third split empty


def test_a_launch_runs_the_asked_splits_or_the_default_within_its_chunks():
    assert splits_for(None, 48, 3072, 256, 132) == 4
    assert splits_for(9, 48, 512, 256, 132) == 2  # two chunks
    assert splits_for(0, 48, 3072, 256, 132) == 1
    assert splits_for(3, 256, 768, 256, 132) == 3  # asked beats the rule


def test_narrow_chunks_split_three_a_range():
    """32 x 128 tiles (LONG_K_TILES) on the down projection: 24 tiles, 384-long ranges."""
    assert default_split_k(24, 3072, 128, 132) == 8
    assert default_split_k(24, 3072, 128, 82) == 7  # two programs an SM on an RTX 3090
