"""Measure FlexAttention against SDPA on decode and prefill shapes of a model config (GPU).

The note in docs/PERF.md on whether FlexAttention joins the registry comes from this script:
compile time per new shape, and step time against SDPA on the same inputs."""

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F


def _time(fn, reps: int = 50) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def measure_shape(compiled, create_block_mask, batch, ctx, heads, kv, d) -> dict:
    dev, dt = "cuda", torch.float16
    q = torch.randn(batch, heads, 1, d, device=dev, dtype=dt)
    k = torch.randn(batch, kv, ctx, d, device=dev, dtype=dt)
    v = torch.randn(batch, kv, ctx, d, device=dev, dtype=dt)
    lens = torch.randint(ctx // 2, ctx + 1, (batch,), device=dev)
    mask = (torch.arange(ctx, device=dev)[None, :] < lens[:, None])[:, None, None, :]

    def live(b, h, q_idx, kv_idx):
        return kv_idx < lens[b]

    def make_mask():
        return create_block_mask(live, batch, None, 1, ctx, device=dev)

    gqa = heads != kv
    t0 = time.perf_counter()
    block_mask = make_mask()
    out = compiled(q, k, v, block_mask=block_mask, enable_gqa=gqa)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    return {
        "batch": batch,
        "ctx": ctx,
        "flex_first_call_s": round(first, 3),
        "flex_ms": _time(lambda: compiled(q, k, v, block_mask=block_mask, enable_gqa=gqa)),
        "block_mask_ms": _time(make_mask),
        "sdpa_masked_ms": _time(
            lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        ),
        "max_abs_diff": (out - ref).abs().max().item(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-config", default="target/model_config.json")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: bench_flex needs a CUDA device", file=sys.stderr)
        return 2
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as exc:
        print(f"error: FlexAttention unavailable in torch {torch.__version__}: {exc}")
        return 2
    cfg = json.load(open(args.model_config))
    heads, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    compiled = torch.compile(flex_attention, dynamic=False)
    rows = []
    for batch, ctx in ((8, 150), (8, 1024), (64, 2048)):
        rows.append(measure_shape(compiled, create_block_mask, batch, ctx, heads, kv, d))
        print(json.dumps(rows[-1]))
    result = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "rows": rows}
    if args.json:
        json.dump(result, open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
