"""The decode attention alone at one shape, launched a few times, for Nsight Compute to
profile one launch (the device machine has `ncu`; docs/PERF.md, runs 137-138). Leave the
GPU's clocks alone (`--clock-control none`, as the device notes ask):

    ncu --clock-control none --kernel-name regex:_decode_split --launch-skip 2 \\
        --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \\
        --section WarpStateStats --section MemoryWorkloadAnalysis \\
        python experiments/ncu_decode_attention.py --shape 4x2048 [--splits 49] [--tiles 16,2,2]

Without --splits, --tiles and --parts the launcher's own rules pick them, with the splits a
decode graph captures for the context's bucket (`graph_context_buckets`, `choose_num_splits`).
"""

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from variants.kernels.decode_attention import paged_decode_attention  # noqa: E402
from variants.kernels.decode_attention_rules import (  # noqa: E402
    choose_num_splits,
    graph_context_buckets,
)

HEADS, KV_HEADS, HEAD_DIM, MAX_POS = 4, 4, 192, 4096  # the public config (or --model-config's)


def parse_ints(text: str | None) -> tuple | None:
    return None if text is None else tuple(int(v) for v in text.split(","))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", default="4x2048", help="ROWSxCONTEXT (a slab pool)")
    p.add_argument("--splits", type=int, default=None)
    p.add_argument("--tiles", default=None, help="BLOCK_N,WARPS,STAGES")
    p.add_argument("--parts", default=None, help="DA,DB: the head's parts")
    p.add_argument("--launches", type=int, default=3)
    p.add_argument("--model-config", default=None, help="a model's heads and positions")
    p.add_argument("--dtype", default="float16")
    args = p.parse_args()
    heads, kv_heads, head_dim, max_pos = HEADS, KV_HEADS, HEAD_DIM, MAX_POS
    if args.model_config:
        c = json.loads(Path(args.model_config).read_text())
        heads = c["num_attention_heads"]
        kv_heads = c.get("num_key_value_heads", heads)
        head_dim = c.get("head_dim") or c["hidden_size"] // heads
        max_pos = c["max_position_embeddings"]
    dtype = getattr(torch, args.dtype)
    if not torch.cuda.is_available():
        print("error: needs a CUDA device", file=sys.stderr)
        return 2
    rows, ctx = (int(v) for v in args.shape.split("x"))
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    capability = torch.cuda.get_device_capability(device)
    bucket = next(c for c in graph_context_buckets(max_pos, capability) if c >= ctx)
    splits = args.splits or choose_num_splits(bucket, rows, kv_heads, sms, capability)
    k = torch.randn(rows * max_pos, kv_heads, head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    q = torch.randn(rows, heads, head_dim, device=device, dtype=dtype)
    table = torch.arange(rows, device=device, dtype=torch.int32)[:, None]  # row b's slab
    lens = torch.full((rows,), ctx, device=device, dtype=torch.int32)
    for _ in range(args.launches):
        paged_decode_attention(
            q, k, v, table, lens, max_pos, 1 / math.sqrt(head_dim), splits,
            tiles=parse_ints(args.tiles), parts=parse_ints(args.parts),
        )  # fmt: skip
    torch.cuda.synchronize()
    read_mb = 2 * rows * ctx * kv_heads * head_dim * k.element_size() / 1e6
    print(f"{rows}x{ctx}: {splits} splits, {read_mb:.1f} MB of keys and values a launch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
