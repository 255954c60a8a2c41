"""Tile sweep of our varlen prefill attention on the GPU: for each packed shape (prompts x
length, head_dim: public 192 by default), every (BLOCK_M, BLOCK_N, warps, stages) tile, timed with
triton.testing.do_bench (or replayed in a CUDA graph, `--graph`, as the prefill graphs run it:
do_bench's eager launches made calls under ~30 us swing by up to 5x on the H200)
against the tile the launcher picks, each checked against causal SDPA per prompt (max abs
difference). Tiles the GPU refuses are listed as failed.

    python experiments/tune_prefill_attention.py [--json PATH] [--graph] [--shape 1x2048 ...]
        [--tiles 64,64,8,2 ...] [--head-dim 128 ...]
"""

import argparse
import functools
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from variants.kernels.device import device_capability  # noqa: E402
from variants.kernels.prefill_attention import (  # noqa: E402
    prefill_stages,
    prefill_tiles,
    varlen_prefill_attention,
)

HEADS, KV_HEADS = 4, 4
TILES = [(32, 32, 8, 2), (64, 32, 8, 2), (64, 64, 8, 2), (128, 32, 8, 2), (128, 64, 8, 2),
         (64, 64, 4, 2), (64, 64, 8, 3), (128, 64, 8, 3)]  # fmt: skip


def median_ms(fn, graph: bool = False) -> float:
    from triton.testing import do_bench, do_bench_cudagraph

    if graph:
        result = do_bench_cudagraph(fn, rep=30, quantiles=[0.5])
    else:
        result = do_bench(fn, quantiles=[0.5], warmup=5, rep=30)
    return float(result[0] if isinstance(result, (list, tuple)) else result)


def reference(q, k, v, lengths):
    """Causal SDPA per prompt, in q's dtype."""
    rows, start = [], 0
    for n in lengths:
        sl = slice(start, start + n)
        out = torch.nn.functional.scaled_dot_product_attention(
            q[sl].transpose(0, 1), k[sl].transpose(0, 1), v[sl].transpose(0, 1), is_causal=True
        )
        rows.append(out.transpose(0, 1))
        start += n
    return torch.cat(rows)


def sweep_shape(prompts: int, length: int, tiles: list, head_dim: int, graph: bool = False) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    tokens = prompts * length
    make = lambda h: torch.randn(tokens, h, head_dim, device="cuda", dtype=torch.float16,
                                 generator=gen)  # fmt: skip
    q, k, v = make(HEADS), make(KV_HEADS), make(KV_HEADS)
    lengths = [length] * prompts
    cu = torch.arange(0, tokens + 1, length, device="cuda", dtype=torch.int32)
    scale = 1 / math.sqrt(head_dim)
    want = reference(q, k, v, lengths)
    capability = device_capability(q.device)
    default = (*prefill_tiles(head_dim, capability, tokens), prefill_stages(capability))
    rows = []
    for tile in [default] + tiles:
        try:
            fn = functools.partial(varlen_prefill_attention, q, k, v, cu, length, scale, tiles=tile)
            err = (fn().float() - want.float()).abs().max().item()
            ms = median_ms(fn, graph)
        except Exception as exc:  # out of resources: the tile does not fit this GPU
            rows.append({"tiles": list(tile), "error": str(exc)[:80]})
            continue
        rows.append({"tiles": list(tile), "us": round(ms * 1e3, 1), "max_diff": err})
    ok = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
    return {"shape": f"{prompts}x{length}", "head_dim": head_dim, "default": rows[0],
            "best": ok[:4], "failed": [r for r in rows if "error" in r]}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", default=None)
    p.add_argument("--graph", action="store_true", help="time CUDA-graph replays")
    p.add_argument("--shape", action="append", default=[], help="PROMPTSxLENGTH; repeatable")
    p.add_argument("--tiles", action="append", default=[], help="BLOCK_M,BLOCK_N,WARPS,STAGES")
    p.add_argument("--head-dim", type=int, action="append", default=[], help="default 192")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA device", file=sys.stderr)
        return 2
    tiles = [tuple(int(x) for x in t.split(",")) for t in args.tiles] or TILES
    results = []
    for head_dim in args.head_dim or [192]:
        for shape in args.shape or ["4x128", "1x2048", "4x2048"]:
            prompts, length = (int(x) for x in shape.split("x"))
            results.append(sweep_shape(prompts, length, tiles, head_dim, args.graph))
            print(json.dumps(results[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
