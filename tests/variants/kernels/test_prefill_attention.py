"""Varlen causal prefill attention against per-prompt float32 causal softmax in torch."""

import math
import sys

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from variants.kernels.device import device_capability  # noqa: E402
from variants.kernels.prefill_attention import (  # noqa: E402
    head_parts,
    prefill_schedule,
    prefill_stages,
    prefill_tiles,
    varlen_prefill_attention,
)


def reference_prefill(q, k, v, lengths):
    """The contract's math per prompt: causal float32 softmax, probabilities in q's dtype."""
    heads, d = q.shape[1], q.shape[2]
    group = heads // k.shape[1]
    outs, start = [], 0
    for n in lengths:
        qs = q[start : start + n].transpose(0, 1)
        ks = k[start : start + n].repeat_interleave(group, dim=1).transpose(0, 1)
        vs = v[start : start + n].repeat_interleave(group, dim=1).transpose(0, 1)
        scores = (qs.float() @ ks.float().transpose(-1, -2)) / math.sqrt(d)
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        probs = scores.masked_fill(causal, float("-inf")).softmax(-1).to(q.dtype)
        outs.append((probs @ vs).transpose(0, 1))
        start += n
    return torch.cat(outs)


# The small float32 cases run on the GPU where there is one (Triton needs device tensors there).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def run_case(lengths, heads, kv_heads, d, dtype=torch.float32, device=DEVICE, seed=0, atol=1e-5,
             padding: int = 0, schedule_size: int = 0, tiles=None):  # fmt: skip
    """`padding` extra packed tokens belong to no prompt; `schedule_size` > 0 runs the fixed-grid
    (scheduled) launch with that many programs per head; `tiles` overrides the launcher's."""
    gen = torch.Generator().manual_seed(seed)
    tokens = sum(lengths) + padding
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=gen).to(device, dtype)
    q, k, v = qkv.split((heads * d, kv_heads * d, kv_heads * d), dim=-1)  # strided views
    q, k, v = q.view(-1, heads, d), k.view(-1, kv_heads, d), v.view(-1, kv_heads, d)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    schedule = None
    if schedule_size:
        capability = device_capability(torch.device(device))
        block_m = tiles[0] if tiles else prefill_tiles(d, capability, tokens)[0]
        table = prefill_schedule(lengths, block_m, schedule_size)
        schedule = torch.tensor(table, device=device).view(2, schedule_size)
    got = varlen_prefill_attention(
        q, k, v, cu.to(device), max(lengths), 1 / math.sqrt(d), schedule, tiles=tiles
    )
    assert got.shape == q.shape and got.dtype == dtype
    real = sum(lengths)
    torch.testing.assert_close(
        got[:real], reference_prefill(q, k, v, lengths), atol=atol, rtol=atol
    )


@pytest.mark.parametrize("heads,kv_heads,d", [(2, 2, 24), (4, 2, 48), (2, 2, 32)])
def test_ragged_with_length_one(heads, kv_heads, d):
    """d 24: a second part masked past HEAD_DIM; 48: two parts that fit; 32: one part."""
    run_case([1, 70, 5, 64], heads, kv_heads, d)


@pytest.mark.parametrize("d", [24, 32])
def test_key_tiles_before_the_diagonal_need_no_mask(d):
    """16-row q-blocks over 16-key tiles: a 100-token prompt's later blocks walk up to six
    whole key tiles unmasked before their diagonal one (and the 37-token prompt's last block
    ends mid-tile)."""
    run_case([100, 37], 2, 2, d, tiles=(16, 16, 4, 2))


@pytest.mark.parametrize("tiles", [(16, 16, 4, 2), (32, 16, 4, 3)])
def test_tile_override(tiles):
    run_case([1, 70, 5], 2, 2, 24, tiles=tiles)


def test_tile_override_runs_a_schedule_built_for_its_block_m():
    """The kernel search's tiles in a prefill graph: a fixed grid whose schedule is built for
    the tiles' 16-row q-blocks, not the rules' 64, padding tokens after the prompts."""
    run_case([70, 5, 1], 2, 2, 24, padding=20, schedule_size=10, tiles=(16, 32, 4, 2))


def test_head_parts_are_powers_of_two_of_at_least_16():
    assert head_parts(192) == (128, 64)
    assert head_parts(128) == (128, 0)
    assert head_parts(160) == (128, 32)
    assert head_parts(24) == (16, 16)  # the second part masked past 8
    assert head_parts(8) == (16, 0)


def test_tiles_follow_head_dim_and_capability():
    assert prefill_tiles(48) == (64, 64, 4)
    assert prefill_tiles(128) == (64, 32, 8)
    assert prefill_tiles(128, (9, 0)) == (64, 64, 4)
    assert prefill_tiles(192) == prefill_tiles(192, (8, 6)) == (32, 32, 8)
    assert prefill_tiles(192, (9, 0)) == prefill_tiles(256, (10, 0)) == (128, 64, 8)


def test_three_pipeline_stages_on_hopper_only():
    assert prefill_stages((9, 0)) == prefill_stages((10, 0)) == 3
    assert prefill_stages((8, 6)) == prefill_stages() == 2


def test_hopper_tiles_follow_the_call_size():
    """Short calls take 16-row q-blocks, mid-size ones 64 x 64, long ones at d > 128 128 x 64;
    before Hopper the size changes nothing."""
    hopper = (9, 0)
    assert prefill_tiles(192, hopper, 512) == (16, 64, 4)
    assert prefill_tiles(64, hopper, 16) == (16, 64, 4)
    assert prefill_tiles(192, hopper, 513) == prefill_tiles(192, hopper, 4096) == (64, 64, 4)
    assert prefill_tiles(192, hopper, 4097) == (128, 64, 8)
    assert prefill_tiles(128, hopper, 8192) == (64, 64, 4)
    assert prefill_tiles(192, (8, 6), 64) == prefill_tiles(192, (8, 6)) == (32, 32, 8)


@pytest.mark.parametrize(
    "short,wide,block_m,size", [(512, 4096, 16, 17), (0, 4096, 64, 8), (0, 100, 128, 6)]
)
def test_hopper_tiles_run_the_schedule_built_for_them(monkeypatch, short, wide, block_m, size):
    """On sm_90 the launcher picks the q-block rows by the call's size (16, 64 or 128 here, the
    thresholds moved so 209 tokens fall in each range): a schedule built with the same call
    covers every row (one built for other blocks would leave rows unwritten or run twice)."""
    import variants.kernels.prefill_attention as module

    monkeypatch.setattr(module, "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(sys.modules[__name__], "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(module, "SHORT_TOKENS", short)
    monkeypatch.setattr(module, "WIDE_TOKENS", wide)
    assert prefill_tiles(160, (9, 0), 209)[0] == block_m
    # the q-blocks of 1 + 70 + 5 + 130 rows in blocks of block_m, and one unused program
    assert sum(-(-n // block_m) for n in (1, 70, 5, 130)) == size - 1
    run_case([1, 70, 5, 130], 2, 1, 160, padding=3, schedule_size=size)


def test_single_prompt_gqa_group_3():
    run_case([40], 3, 1, 16)


def test_schedule_lists_q_blocks_highest_index_first_then_padding():
    """Prompts of 1, 3 and 2 q-blocks: index 2 (prompt 1), index 1 (prompts 1, 2), index 0
    (all three), then two padding programs."""
    assert prefill_schedule([1, 70, 64], 32, 8).tolist() == [1, 1, 2, 0, 1, 2, -1, -1,
                                                              2, 1, 1, 0, 0, 0, 0, 0]  # fmt: skip
    assert prefill_schedule([], 32, 2).tolist() == [-1, -1, 0, 0]
    with pytest.raises(ValueError, match="q-blocks"):
        prefill_schedule([100], 32, 3)


@pytest.mark.parametrize("heads,kv_heads,d", [(2, 2, 24), (4, 2, 48)])
def test_scheduled_grid_with_padding_tokens_matches(heads, kv_heads, d):
    """The CUDA-graph launch: more programs than q-blocks, packed tokens past the last prompt."""
    run_case([1, 70, 5, 64], heads, kv_heads, d, padding=11, schedule_size=12)


# ------------------------------------------------------------------ GPU, public model sizes
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "lengths", [[128] * 4, [128] * 8, [1, 7, 13, 64, 128, 300], [2048, 5]], ids=str
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_public_sizes(lengths, dtype):
    atol = 2e-3 if dtype == torch.float16 else 1e-2
    run_case(lengths, 4, 4, 192, dtype, "cuda", atol=atol)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("heads,kv_heads,d", [(8, 2, 128), (4, 4, 64), (4, 1, 256)])
def test_gpu_other_shapes(heads, kv_heads, d):
    run_case([1, 100, 257], heads, kv_heads, d, torch.float16, "cuda", atol=2e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_scheduled_public_size():
    run_case([1, 7, 13, 64, 128, 300], 4, 4, 192, torch.float16, "cuda", atol=2e-3,
             padding=99, schedule_size=40)  # fmt: skip
