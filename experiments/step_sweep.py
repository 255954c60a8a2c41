"""The measuring loop shared by the step sweeps (step_tiles.py, step_kernels.py): for each
setting in turn, rounds interleaved, a fresh engine of the preset; per shape (rows x context) a
prefill, three decode steps, then the GPU time of the step's CUDA graph replayed back to back;
the logits of each setting against the first setting's."""

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.decode_step_profile import graph_replay_us  # noqa: E402
from variants import build_engine  # noqa: E402
from variants.presets import PRESETS  # noqa: E402


def main(description: str, use, setting_help: str, check=None) -> int:
    """The command line of a sweep: shapes, rounds and NAME=SETTING pairs; `check(setting)`
    raises on a bad setting before any engine is built; `use("default")` is restored at the
    end."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model-config", default="target/model_config.json")
    p.add_argument("--weight-dir", default="target/weights")
    p.add_argument("--preset", default="slab-triton-pdl-allgraphs", choices=sorted(PRESETS))
    p.add_argument("--shapes", default="8x40,8x150,1x150,16x100,32x512")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--setting", action="append", default=[], help=setting_help)
    args = p.parse_args()
    settings = dict(s.split("=", 1) for s in args.setting) or {"default": "default"}
    for setting in settings.values():
        if check is not None:
            check(setting)
    try:
        sweep(args, settings, use)
    finally:
        use("default")
    return 0


def sweep(args, settings: dict, use) -> dict:
    """{(rows, ctx, name): [us per round]}; `use(setting)` routes the engine through a setting
    before its engine is built. Prints each measurement and the medians."""
    config = json.loads(Path(args.model_config).read_text())
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
    for batch, ctx in shapes:
        cells = [f"{n} {statistics.median(gpu_us[batch, ctx, n]):.1f}" for n in settings]
        print(f"{batch}x{ctx} (median us): " + "  ".join(cells), flush=True)
    return gpu_us
