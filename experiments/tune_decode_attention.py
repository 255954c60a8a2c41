"""Tile and split sweep of our decode attention kernel on the GPU: for each (batch, context,
cache layout) shape, every (BLOCK_N, num_warps, num_stages) x split count x tokens-per-split,
timed with triton.testing.do_bench (or replayed in a CUDA graph, `--graph`, as an engine runs
it, over enough copies of the pools that L2 holds none of them, as in a real step); prints the
best configurations and the cache-read bandwidth they reach (K and V bytes of
the live context / time), next to the defaults the launcher picks today.

    python experiments/tune_decode_attention.py [--json PATH] [--quick] [--graph]
        [--shape 64x2048:paged64 ...] [--tiles 32,4,2 ...] [--split-tokens 64,128]
        [--splits 16,32,49,64]
"""

import argparse
import functools
import itertools
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from variants.kernels.decode_attention import paged_decode_attention  # noqa: E402
from variants.kernels.decode_attention_rules import (  # noqa: E402
    SPLIT_TOKENS,
    choose_num_splits,
    graph_context_buckets,
)

HEADS, KV_HEADS, HEAD_DIM, MAX_POS = 4, 4, 192, 4096


def make_case(batch: int, ctx: int, layout: str, dtype=torch.float16):
    """Slab: one slot of MAX_POS per row (block size MAX_POS); paged64: shuffled 64-token
    blocks. Every row holds `ctx` live tokens."""
    gen = torch.Generator().manual_seed(0)
    block = MAX_POS if layout == "slab" else 64
    width = -(-ctx // block) if layout != "slab" else 1
    blocks = batch * width
    table = torch.randperm(blocks, generator=gen).view(batch, width).to("cuda", torch.int32)
    shape = (blocks * block, KV_HEADS, HEAD_DIM)
    k = torch.randn(shape, device="cuda", dtype=dtype)
    v = torch.randn(shape, device="cuda", dtype=dtype)
    q = torch.randn(batch, HEADS, HEAD_DIM, device="cuda", dtype=dtype)
    lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
    return q, k, v, table, lens, block


def median_ms(fn, graph: bool = False) -> float:
    from triton.testing import do_bench, do_bench_cudagraph

    if graph:
        result = do_bench_cudagraph(fn, rep=20, quantiles=[0.5])
    else:
        result = do_bench(fn, quantiles=[0.5], warmup=5, rep=20)
    return float(result[0] if isinstance(result, (list, tuple)) else result)


def cold_copies(k: torch.Tensor, graph: bool) -> int:
    """Pool copies a graph cycles through so that L2 keeps none (64 MiB of K and V, at most
    32 copies); one without a graph."""
    if not graph:
        return 1
    return max(1, min(32, -(-(64 << 20) // (2 * k.numel() * k.element_size()))))


def run_all(calls: list) -> None:
    for fn in calls:
        fn()


def sweep_shape(batch, ctx, layout, sms, tiles, split_tokens, graph, splits=None) -> dict:
    q, k, v, table, lens, block = make_case(batch, ctx, layout)
    copies = cold_copies(k, graph)
    pools = [(k, v)] + [(k.clone(), v.clone()) for _ in range(copies - 1)]
    scale = 1 / math.sqrt(HEAD_DIM)
    read = 2 * batch * ctx * KV_HEADS * HEAD_DIM * k.element_size()
    want = paged_decode_attention(q, k, v, table, lens, block, scale, 1)
    capability = torch.cuda.get_device_capability()
    bucket = next(c for c in graph_context_buckets(MAX_POS, capability) if c >= ctx)  # a graph's
    default_splits = choose_num_splits(bucket, batch, KV_HEADS, sms, capability)  # splits
    rows = []
    arrivals = torch.zeros(batch * KV_HEADS, device="cuda", dtype=torch.int32)
    split_counts = sorted(set(splits or (1, 2, 4, 8, 16)) | {default_splits})
    for (bn, warps, stages), splits, per_split in itertools.product(
        tiles, split_counts, split_tokens
    ):
        config = {"tiles": [bn, warps, stages], "splits": splits, "split_tokens": per_split}
        try:
            calls = [
                functools.partial(
                    paged_decode_attention,
                    q,
                    pk,
                    pv,
                    table,
                    lens,
                    block,
                    scale,
                    splits,
                    tiles=(bn, warps, stages),
                    arrivals=arrivals,
                    split_tokens=per_split,
                )  # fmt: skip
                for pk, pv in pools
            ]
            got = calls[0]()
            err = (got.float() - want.float()).abs().max().item()
            ms = median_ms(functools.partial(run_all, calls), graph) / copies
        except Exception as exc:  # out of resources: that tile does not fit this GPU
            rows.append({**config, "error": str(exc)[:80]})
            continue
        rows.append({**config, "us": round(ms * 1e3, 2), "gbps": round(read / ms / 1e6),
                     "max_diff": err})  # fmt: skip
    ok = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
    default = next(
        (r for r in rows if r.get("tiles") == [32, 4, 2] and r["splits"] == default_splits
         and r["split_tokens"] == SPLIT_TOKENS),
        None,
    )  # fmt: skip
    return {"batch": batch, "ctx": ctx, "layout": layout, "read_mb": round(read / 1e6, 1),
            "copies": copies,
            "default_splits_at_capture": default_splits, "default": default, "best": ok[:5],
            "failed": sum("error" in r for r in rows)}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true", help="default tiles only, splits swept")
    p.add_argument("--graph", action="store_true", help="time CUDA-graph replays")
    p.add_argument("--shape", action="append", default=[], help="BATCHxCTX:LAYOUT; repeatable")
    p.add_argument("--tiles", action="append", default=[], help="BLOCK_N,WARPS,STAGES")
    p.add_argument("--split-tokens", default=str(SPLIT_TOKENS), help="comma-separated")
    p.add_argument(
        "--splits",
        default="1,2,4,8,16",
        help="split counts, comma-separated "
        "(the launcher's own count at the shape's graph bucket is always added)",
    )
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA device", file=sys.stderr)
        return 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = [(8, 150, "slab"), (8, 1024, "slab"), (64, 2048, "slab"), (64, 2048, "paged64"),
              (32, 512, "paged64")]  # fmt: skip
    if args.shape:
        shapes = [(int(bc.split("x")[0]), int(bc.split("x")[1]), layout)
                  for bc, layout in (s.split(":") for s in args.shape)]  # fmt: skip
    if args.tiles:
        tiles = [tuple(int(x) for x in t.split(",")) for t in args.tiles]
    elif args.quick:
        tiles = [(32, 4, 2)]
    else:
        tiles = list(itertools.product((16, 32, 64), (4, 8), (2, 3)))
    split_tokens = [int(x) for x in args.split_tokens.split(",")]
    results = []
    for batch, ctx, layout in shapes:
        splits = [int(x) for x in args.splits.split(",")]
        results.append(
            sweep_shape(batch, ctx, layout, sms, tiles, split_tokens, args.graph, splits)
        )
        r = results[-1]
        print(json.dumps({k: r[k] for k in ("batch", "ctx", "layout", "default")}), flush=True)
        for best in r["best"][:3]:
            print("   best", json.dumps(best), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
