"""The decode attention's tiles and split size measured where they matter: the GPU time of a
whole decode step (its CUDA graph replayed back to back) of the preset's engine, per shape, for
each setting in turn, rounds interleaved; the logits of each setting against the first's.

    python scripts/step_tiles.py --shapes 8x40,32x512 \\
        --setting old=32:32,4,2 --setting new=default --rounds 2

A setting is `default` (what the code picks) or SPLIT_TOKENS:BLOCK_N,WARPS,STAGES for every
batch (the same for all shapes)."""

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import variants.attention.triton_attention as triton_attention  # noqa: E402
from scripts.decode_step_profile import graph_replay_us  # noqa: E402
from variants import build_engine  # noqa: E402
from variants.presets import PRESETS  # noqa: E402

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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-config", default="target/model_config.json")
    p.add_argument("--weight-dir", default="target/weights")
    p.add_argument("--preset", default="slab-triton-pdl-allgraphs", choices=sorted(PRESETS))
    p.add_argument("--shapes", default="8x40,8x150,1x150,16x100,32x512")
    p.add_argument("--setting", action="append", default=[], help="NAME=default|S:N,W,ST")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    config = json.loads(Path(args.model_config).read_text())
    settings = dict(s.split("=", 1) for s in args.setting) or {"default": "default"}
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    gpu_us: dict = {}
    first: dict = {}
    for r in range(args.rounds):
        for name, setting in settings.items():
            use(setting)
            engine = build_engine(config, args.weight_dir, "cuda", PRESETS[args.preset])
            for batch, ctx in shapes:
                gen = torch.Generator().manual_seed(batch * 1000 + ctx)
                ids = list(range(batch))
                engine.prefill(ids, [torch.randint(0, config["vocab_size"], (ctx,),
                                                   generator=gen).cuda() for _ in ids])  # fmt: skip
                for _ in range(3):
                    logits = engine.decode(
                        ids, torch.randint(0, config["vocab_size"], (batch,), generator=gen).cuda()
                    )
                us = graph_replay_us(engine, batch, max(engine.lengths.values()), replays=200)
                gpu_us.setdefault((batch, ctx, name), []).append(us["gpu_us"])
                diff = (first.setdefault((batch, ctx), logits) - logits).abs().max().item()
                print(f"round {r} {name} {batch}x{ctx}: step graph {us['gpu_us']} us, "
                      f"logits max diff to the first setting {diff:.2e}", flush=True)  # fmt: skip
                engine.remove(ids)
            del engine
    use("default")
    for batch, ctx in shapes:
        cells = [f"{n} {statistics.median(gpu_us[batch, ctx, n]):.1f}" for n in settings]
        print(f"{batch}x{ctx} (median us): " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
