"""The decode attention's tiles and split size measured where they matter: the GPU time of a
whole decode step (its CUDA graph replayed back to back) of the preset's engine, per shape, for
each setting in turn, rounds interleaved; the logits of each setting against the first's.

    python scripts/step_tiles.py --shapes 8x40,32x512 \\
        --setting old=32:32,4,2 --setting new=default --rounds 2

A setting is `default` (what the code picks) or SPLIT_TOKENS:BLOCK_N,WARPS,STAGES for every
batch (the same for all shapes)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import variants.attention.triton_attention as triton_attention  # noqa: E402
from scripts.step_sweep import main  # noqa: E402

DEFAULT = triton_attention.paged_decode_attention


def use(setting: str) -> None:
    """Route the engine's decode attention through `setting`."""
    if setting == "default":
        triton_attention.paged_decode_attention = DEFAULT
        return
    split, tiles = setting.split(":")
    tiles = tuple(int(v) for v in tiles.split(","))

    def forced(*args, **kwargs):
        return DEFAULT(*args, split_tokens=int(split), tiles=tiles, **kwargs)

    triton_attention.paged_decode_attention = forced


if __name__ == "__main__":
    sys.exit(main(__doc__, use, "NAME=default|S:N,W,ST"))
