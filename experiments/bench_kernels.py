"""GPU micro-benchmark of the Triton kernels in variants/kernels against their torch equivalents.

Times each pair with triton.testing.do_bench (median, L2 flushed between runs) at the public
model's sizes (heads 4, kv heads 4, head_dim 192, hidden 768) and prints JSON, one record per
case; decode records add the cache-read bandwidth (K and V bytes of the live context / time).

    python experiments/bench_kernels.py [--json PATH] [--dtype float16|bfloat16]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

log = logging.getLogger("bench_kernels")
HEADS, KV_HEADS, HEAD_DIM, HIDDEN, BLOCK_SIZE = 4, 4, 192, 768, 16


def median_ms(fn) -> float:
    from triton.testing import do_bench

    result = do_bench(fn, quantiles=[0.5])  # a float or a one-element list, by version
    return float(result[0] if isinstance(result, (list, tuple)) else result)


def record(kernel: str, case: str, triton_ms: float, torch_ms: float, **extra) -> dict:
    row = {
        "kernel": kernel,
        "case": case,
        "triton_us": round(triton_ms * 1e3, 2),
        "torch_us": round(torch_ms * 1e3, 2),
        "speedup": round(torch_ms / triton_ms, 3),
        **extra,
    }
    log.info("%s %s: triton %.1f us, torch %.1f us", kernel, case, row["triton_us"],
             row["torch_us"])  # fmt: skip
    return row


def bench_decode(batch: int, ctx: int, dtype, sms: int) -> dict:
    from variants.kernels.decode_attention import paged_decode_attention
    from variants.kernels.decode_attention_rules import choose_num_splits

    gen = torch.Generator().manual_seed(0)
    width = -(-ctx // BLOCK_SIZE)
    blocks = batch * width
    table = torch.randperm(blocks, generator=gen).view(batch, width).to("cuda", torch.int32)
    shape = (blocks * BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    k_pool = torch.randn(shape, device="cuda", dtype=dtype)
    v_pool = torch.randn(shape, device="cuda", dtype=dtype)
    q = torch.randn(batch, HEADS, HEAD_DIM, device="cuda", dtype=dtype)
    lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
    scale = 1 / math.sqrt(HEAD_DIM)
    splits = choose_num_splits(ctx, batch, KV_HEADS, sms, torch.cuda.get_device_capability())
    out = torch.empty_like(q)

    def triton_fn():
        paged_decode_attention(q, k_pool, v_pool, table, lens, BLOCK_SIZE, scale, splits, out=out)

    table_long = table.long()
    live = torch.arange(ctx, device="cuda") < lens[:, None]
    group = HEADS // KV_HEADS

    def torch_fn():  # what the paged cache + SDPA path does today: gather, then masked SDPA
        view = (blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
        k = k_pool.view(view)[table_long].view(batch, -1, KV_HEADS, HEAD_DIM)[:, :ctx]
        v = v_pool.view(view)[table_long].view(batch, -1, KV_HEADS, HEAD_DIM)[:, :ctx]
        qg = q.view(batch, KV_HEADS, group, HEAD_DIM)
        torch.nn.functional.scaled_dot_product_attention(
            qg, k.transpose(1, 2), v.transpose(1, 2), attn_mask=live[:, None, None, :]
        )

    kv_bytes = 2 * batch * ctx * KV_HEADS * HEAD_DIM * k_pool.element_size()
    t_ms, r_ms = median_ms(triton_fn), median_ms(torch_fn)
    return record(
        "decode_attention",
        f"batch {batch} x ctx {ctx}",
        t_ms,
        r_ms,
        num_splits=splits,
        kv_bytes=kv_bytes,
        triton_gb_per_s=round(kv_bytes / t_ms / 1e6, 1),
        torch_gb_per_s=round(kv_bytes / r_ms / 1e6, 1),
    )


def _flash_sdpa(q, k, v):
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    except RuntimeError:  # no flash kernel for this head_dim / GPU: let torch choose
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def bench_prefill(lengths: list, dtype) -> dict:
    from variants.attention.padding import PrefillBatch, from_padded, to_padded
    from variants.kernels.prefill_attention import varlen_prefill_attention

    tokens, longest = sum(lengths), max(lengths)
    q = torch.randn(tokens, HEADS, HEAD_DIM, device="cuda", dtype=dtype)
    k = torch.randn(tokens, KV_HEADS, HEAD_DIM, device="cuda", dtype=dtype)
    v = torch.randn(tokens, KV_HEADS, HEAD_DIM, device="cuda", dtype=dtype)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
    cu = cu.to(torch.int32)
    uniform = min(lengths) == longest
    pad = [b * longest + p for b, n in enumerate(lengths) for p in range(n)]
    batch = PrefillBatch(
        lengths,
        longest,
        uniform,
        None if uniform else torch.tensor(pad, device="cuda"),
        cu[1:].long() - 1,
    )
    scale = 1 / math.sqrt(HEAD_DIM)

    def triton_fn():
        varlen_prefill_attention(q, k, v, cu, longest, scale)

    def torch_fn():  # the engine's SDPA prefill: pad, flash SDPA, unpad
        out = _flash_sdpa(to_padded(q, batch), to_padded(k, batch), to_padded(v, batch))
        from_padded(out, batch)

    case = f"{len(lengths)}x{longest}" if uniform else f"ragged {lengths}"
    return record("prefill_attention", case, median_ms(triton_fn), median_ms(torch_fn))


def bench_norm(rows: int, dtype) -> dict:
    from variants.kernels.fused_norm import add_rms_norm
    from variants.layers.rmsnorm import rms_norm

    x = torch.randn(rows, HIDDEN, device="cuda", dtype=dtype)
    delta = torch.randn_like(x)
    weight = torch.ones(HIDDEN, device="cuda", dtype=dtype)

    def torch_fn():
        new_x = x + delta
        rms_norm(new_x, weight, 1e-5)

    t_ms = median_ms(lambda: add_rms_norm(x, delta, weight, 1e-5))
    return record("add_rms_norm", f"{rows} rows x {HIDDEN}", t_ms, median_ms(torch_fn))


def bench_rope(tokens: int, dtype) -> dict:
    from variants.kernels.fused_rope import rope_and_cache_write
    from variants.layers.rope import RopeTable, apply_rope

    qkv_dim = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    qkv = torch.randn(tokens, qkv_dim, device="cuda", dtype=dtype)
    q, k, v = qkv.split((HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM), dim=-1)
    q, k, v = (t.view(tokens, -1, HEAD_DIM) for t in (q, k, v))
    rope = RopeTable(HEAD_DIM, 4096, 10000.0, "cuda", dtype)
    cos, sin = rope.at(torch.arange(tokens, device="cuda"))
    k_pool = torch.zeros(4 * tokens, KV_HEADS, HEAD_DIM, device="cuda", dtype=dtype)
    v_pool = torch.zeros_like(k_pool)
    index = torch.randperm(4 * tokens, device="cuda")[:tokens]

    def triton_fn():
        rope_and_cache_write(q, k, v, cos, sin, k_pool, v_pool, index)

    def torch_fn():
        apply_rope(q, cos, sin)
        k_pool.index_copy_(0, index, apply_rope(k, cos, sin))
        v_pool.index_copy_(0, index, v)

    return record("rope_and_cache_write", f"{tokens} tokens", median_ms(triton_fn),
                  median_ms(torch_fn))  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the records here (default: stdout)")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if not torch.cuda.is_available():
        print("bench_kernels: no CUDA device; these are GPU benchmarks", file=sys.stderr)
        return 2
    try:
        import triton
    except ImportError:
        print("bench_kernels: triton is not installed", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    props = torch.cuda.get_device_properties(0)
    rows = [
        bench_decode(8, 150, dtype, props.multi_processor_count),
        bench_decode(64, 2048, dtype, props.multi_processor_count),
        bench_prefill([128] * 4, dtype),
        bench_prefill([1, 7, 13, 64, 128, 300], dtype),
        bench_norm(8, dtype),
        bench_norm(512, dtype),
        bench_rope(8, dtype),
        bench_rope(512, dtype),
    ]
    report = {
        "device": props.name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "dtype": args.dtype,
        "results": rows,
    }
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
        log.info("wrote %s", args.json)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
