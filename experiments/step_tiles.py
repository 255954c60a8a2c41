"""The decode attention's tiles, split size, head parts and prefetch measured where they
matter: the GPU time of a whole decode step (its CUDA graph replayed back to back) of the
preset's engine, per shape, for each setting in turn, rounds interleaved; the logits of each
setting against the first's.

    python experiments/step_tiles.py --shapes 8x40,32x512 \\
        --setting old=32:32,4,2 --setting new=default --rounds 2
    python experiments/step_tiles.py --shapes 4x2048 \\
        --setting rule=default --setting parts=-:-:128,64 --setting stages3=-:16,2,3

A setting is `default` (what the code picks) or SPLIT_TOKENS:BLOCK_N,WARPS,STAGES[:DA,DB
[:PREFETCH_TILES]] for every batch (the same for all shapes); `-` leaves a field to the
launcher's rules. Giving the split size or the tiles turns the longer splits of
`long_split_programs` off, as the launcher does."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import variants.attention.triton_attention as triton_attention  # noqa: E402
from experiments.step_sweep import main  # noqa: E402

DEFAULT = triton_attention.paged_decode_attention
FIELDS = ("split_tokens", "tiles", "parts", "prefetch_tiles")


def parse(setting: str) -> dict:
    """The launcher's keyword arguments a setting forces ({} for `default`)."""
    if setting == "default":
        return {}
    values = setting.split(":")
    if len(values) > len(FIELDS):
        raise ValueError(f"setting {setting!r} has more than {len(FIELDS)} fields")
    forced = {}
    for name, text in zip(FIELDS, values):
        if text == "-":
            continue
        numbers = tuple(int(v) for v in text.split(","))
        forced[name] = numbers if name in ("tiles", "parts") else numbers[0]
    return forced


def use(setting: str) -> None:
    """Route the engine's decode attention through `setting`."""
    forced = parse(setting)
    if not forced:
        triton_attention.paged_decode_attention = DEFAULT
        return

    def routed(*args, **kwargs):
        return DEFAULT(*args, **forced, **kwargs)

    triton_attention.paged_decode_attention = routed


if __name__ == "__main__":
    sys.exit(main(__doc__, use, "NAME=default|S:N,W,ST[:DA,DB[:P]]", check=parse))
