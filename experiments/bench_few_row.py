"""GPU micro-benchmark of the few-row fused kernels (variants/kernels/{norm_qkv_rope,
few_row_linear,norm_swiglu}.py) against what the Triton stack runs for the same work, at the
public model's sizes, inside CUDA graphs (as a decode step runs them).

Each measurement replays a graph of one call per weight copy, over enough copies (at least 12,
as many layers, and 64 MiB of weights) that L2 holds none of them, as in a real step; the time
per call is the median over replays divided by the copies. It also tries a short list of tiles
(BLOCK_N, BLOCK_K, warps, stages) per kernel, each with every split-K count of --splits
(variants/kernels/split_k.py), and reports the best beside the default.

    python experiments/bench_few_row.py [--rows 1,8,64] [--splits 1,2,4] [--json PATH] [--no-tiles]
        [--model-config CONFIG.json]

`--model-config`: a model's own sizes (hidden, intermediate, heads, kv heads, vocab) instead of
the public model's. Two rows beside the fused QKV kernel say what its norm, RoPE and cache
write cost: the same weight through the plain projection (`qkv as a projection`) and a copy of
as many bytes (`copy of the qkv bytes`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

log = logging.getLogger("bench_few_row")
# the public model's sizes: hidden, intermediate, heads, kv heads, head_dim, vocab
PUBLIC = {"hidden": 768, "inter": 3072, "heads": 4, "kv_heads": 4, "head_dim": 192, "vocab": 4096}
EPS = 1e-5
TILES = [
    (16, 256, 4, 3), (16, 128, 4, 5), (32, 64, 4, 4), (32, 256, 8, 3), (16, 512, 8, 2),
    (16, 1024, 4, 1), (16, 1024, 8, 1), (32, 1024, 8, 1), (16, 1024, 16, 1),
]  # fmt: skip
SPLIT_TILES = [(16, 256, 4, 3), (16, 128, 4, 4), (32, 128, 4, 3), (16, 64, 4, 4), (32, 64, 4, 4)]


def graph_us(calls: list, repeats: int = 20) -> float:
    """Median microseconds per call of a CUDA graph holding every call in `calls` once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls:
            fn()  # warm-up: compiles, picks kernels, allocates
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for fn in calls:
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return sorted(times)[len(times) // 2]


def copies_for(weight_bytes: int) -> int:
    return max(12, -(-(64 << 20) // weight_bytes))


def sizes_of(config: dict) -> dict:
    heads = config["num_attention_heads"]
    return {
        "hidden": config["hidden_size"], "inter": config["intermediate_size"], "heads": heads,
        "kv_heads": config.get("num_key_value_heads", heads),
        "head_dim": config.get("head_dim") or config["hidden_size"] // heads,
        "vocab": config["vocab_size"],
    }  # fmt: skip


def cases(rows: int, dtype, sizes: dict) -> dict:
    """name -> (weight shape, ours(w, tiles), theirs(w)): the same work each way."""
    from variants.kernels.few_row_linear import few_row_linear
    from variants.kernels.fused_norm import add_rms_norm
    from variants.kernels.fused_rope import rope_and_cache_write
    from variants.kernels.fused_silu import silu_mul
    from variants.kernels.norm_qkv_rope import norm_qkv_rope
    from variants.kernels.norm_swiglu import norm_swiglu
    from variants.layers.rmsnorm import rms_norm
    from variants.layers.rope import RopeTable

    dev = "cuda"
    HIDDEN, INTER, VOCAB, HEAD_DIM = (sizes[k] for k in ("hidden", "inter", "vocab", "head_dim"))
    HEADS, KV_HEADS = sizes["heads"], sizes["kv_heads"]
    x = torch.randn(rows, HIDDEN, device=dev, dtype=dtype)
    act = torch.randn(rows, INTER, device=dev, dtype=dtype)
    norm = torch.ones(HIDDEN, device=dev, dtype=dtype)
    rope = RopeTable(HEAD_DIM, 4096, 10000.0, dev, dtype)
    positions = torch.arange(rows, device=dev) + 100
    slots = torch.arange(rows, device=dev)
    k_pool = torch.zeros(rows, KV_HEADS, HEAD_DIM, device=dev, dtype=dtype)
    v_pool = torch.zeros_like(k_pool)
    q_dim, kv_dim = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    cos, sin = rope.at(positions)  # once a step in both stacks, not once a layer

    def qkv_ours(w, tiles, split=None):
        return norm_qkv_rope(x, norm, w, EPS, HEAD_DIM, q_dim, cos, sin, k_pool, v_pool, slots,
                             tiles=tiles, split_k=split)  # fmt: skip

    def qkv_theirs(w):
        _, h = add_rms_norm(x, None, norm, EPS)
        q, k, v = F.linear(h, w).split((q_dim, kv_dim, kv_dim), dim=-1)
        q, k, v = (t.reshape(rows, -1, HEAD_DIM) for t in (q, k, v))
        rope_and_cache_write(q, k, v, cos, sin, k_pool, v_pool, slots)

    def gate_up_theirs(w):
        _, h = add_rms_norm(x, None, norm, EPS)
        return silu_mul(*F.linear(h, w).chunk(2, dim=-1))

    def head_theirs(w):
        return F.linear(rms_norm(x, norm, EPS), w).float()

    def copy_of(w):  # as many bytes read and written as the weight has
        return w.view(-1)[: w.numel() // 2].clone()

    qkv_shape = (q_dim + 2 * kv_dim, HIDDEN)
    return {
        "norm+qkv+rope+cache": (qkv_shape, qkv_ours, qkv_theirs),
        "qkv as a projection": (
            qkv_shape,
            lambda w, t, s=None: few_row_linear(x, w, tiles=t, split_k=s),
            copy_of,
        ),
        "o+residual": (
            (HIDDEN, q_dim),
            lambda w, t, s=None: few_row_linear(x, w, residual=x, tiles=t, split_k=s),
            lambda w: x + F.linear(x, w),
        ),
        "norm+gate_up+silu": (
            (2 * INTER, HIDDEN),
            lambda w, t, s=None: norm_swiglu(x, norm, w, EPS, tiles=t, split_k=s),
            gate_up_theirs,
        ),
        "down+residual": (
            (HIDDEN, INTER),
            lambda w, t, s=None: few_row_linear(act, w, residual=x, tiles=t, split_k=s),
            lambda w: x + F.linear(act, w),
        ),
        "norm+head": (
            (VOCAB, HIDDEN),
            lambda w, t, s=None: few_row_linear(
                x, w, norm=norm, eps=EPS, out_dtype=torch.float32, tiles=t, split_k=s
            ),
            head_theirs,
        ),
    }


def per_weight(fn, weights: list, *extra) -> list:
    return [lambda w=w: fn(w, *extra) for w in weights]


def split_sweep(ours, weights: list, splits: list) -> list:
    """[tiles, split, us] for the default tiles and SPLIT_TILES, each at every split count."""
    found = []
    for tiles in [None] + SPLIT_TILES:
        for split in splits:
            try:
                us = graph_us(per_weight(ours, weights, tiles, split))
            except Exception as err:  # noqa: BLE001 - a tile that does not compile
                log.info("tiles %s split %d: %s", tiles, split, str(err).splitlines()[0][:100])
                continue
            found.append([tiles, split, round(us, 2)])
    return sorted(found, key=lambda row: row[2])


def bench(rows: int, dtype, try_tiles: bool, splits: list, sizes: dict, only=None) -> list:
    found = []
    for name, (shape, ours, theirs) in cases(rows, dtype, sizes).items():
        if only and name not in only:
            continue
        weight_bytes = shape[0] * shape[1] * torch.finfo(dtype).bits // 8
        weights = [torch.randn(shape, device="cuda", dtype=dtype) / shape[1] ** 0.5
                   for _ in range(copies_for(weight_bytes))]  # fmt: skip
        base = graph_us(per_weight(ours, weights, None))
        torch_us = graph_us(per_weight(theirs, weights))
        best, best_us = None, base
        if try_tiles:
            for tiles in TILES:
                try:
                    us = graph_us(per_weight(ours, weights, tiles))
                except Exception as err:  # noqa: BLE001 - a tile that does not compile
                    log.info("%s tiles %s: %s", name, tiles, str(err).splitlines()[0][:100])
                    continue
                if us < best_us:
                    best, best_us = tiles, us
        row = {
            "case": name, "rows": rows, "weight_mib": round(weight_bytes / 2**20, 2),
            "copies": len(weights), "fused_us": round(base, 2), "stack_us": round(torch_us, 2),
            "speedup": round(torch_us / base, 2),
            "fused_tb_per_s": round(weight_bytes / base / 1e6, 2),
            "best_tiles": best, "best_us": round(best_us, 2),
        }  # fmt: skip
        if splits:
            row["splits"] = split_sweep(ours, weights, splits)
        log.info("%s", row)
        found.append(row)
        del weights
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", default="1,8,64")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--json", default=None)
    p.add_argument("--no-tiles", action="store_true")
    p.add_argument("--splits", default="", help="split-K counts to sweep, e.g. 1,2,4")
    p.add_argument("--model-config", default=None, help="a model's sizes (default: the public)")
    p.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not torch.cuda.is_available():
        log.error("bench_few_row needs a CUDA device")
        return 2
    dtype = getattr(torch, args.dtype)
    sizes = (
        sizes_of(json.loads(Path(args.model_config).read_text())) if args.model_config else PUBLIC
    )
    found = []
    for rows in (int(r) for r in args.rows.split(",")):
        splits = [int(n) for n in args.splits.split(",") if n]
        only = [c for c in args.cases.split(",") if c]
        found += bench(rows, dtype, not args.no_tiles, splits, sizes, only)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "sizes": sizes}
    text = json.dumps({"meta": meta, "results": found}, indent=1)
    if args.json:
        Path(args.json).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
