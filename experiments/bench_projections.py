"""A layer's four projections on cuBLAS (F.linear) against our split-K kernel (`few_row_linear`,
plain and under PDL), at each row count: CUDA graphs of back-to-back GEMMs over enough weight
copies (at least 12, and 64 MiB: `bench_few_row.copies_for`) that L2 holds none of them, as in
a decode step; us a GEMM, median of 20 replays.

    python experiments/bench_projections.py --rows 16,32,48,64,128,256,512 [--sweep]

`--sweep`: ours also at each launch of a small grid (column tile, reduction chunk, warps,
splits), its best beside cuBLAS: whether a prefill's 128-512 rows leave cuBLAS room.

Isolated chains flatter PDL: in a decode step the other kernels already launch under it
(docs/PERF.md, runs 178-179)."""

import argparse
import functools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.bench_few_row import copies_for, graph_us  # noqa: E402
from variants.kernels.device import device_sm_count  # noqa: E402
from variants.kernels.few_row_linear import few_row_linear  # noqa: E402
from variants.kernels.pdl import pdl_supported  # noqa: E402


def projection_shapes(config: dict) -> dict:
    """name -> (N, K) of the model's fused projections and its head."""
    h, i, d = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    return {"qkv": (q + 2 * kv, h), "output": (h, q), "gate-up": (2 * i, h), "down": (h, i),
            "head": (config["vocab_size"], h)}  # fmt: skip


def chain(linear, x: torch.Tensor, weights: list) -> list:
    """The graph's calls: x through each weight copy in turn."""
    return [functools.partial(linear, x, w) for w in weights]


# (BLOCK_N, BLOCK_K, warps, stages) x split_k
SWEEP = [((bn, bk, w, 3), s) for bn in (64, 128) for bk in (64, 128) for w in (4, 8)
         for s in (1, 2, 4)]  # fmt: skip


def best_launch(x: torch.Tensor, weights: list, sms: int) -> tuple:
    """The fastest of SWEEP's launches of ours on this chain: (us, (tiles, split_k))."""
    best = (float("inf"), None)
    for tiles, split in SWEEP:
        ours = functools.partial(few_row_linear, sm_count=sms, tiles=tiles, split_k=split)
        try:
            us = graph_us(chain(ours, x, weights))
        except Exception as e:  # (a launch that does not fit this GPU: out of shared memory)
            print(f"  {tiles} x{split}: {type(e).__name__}", flush=True)
            continue
        best = min(best, (us, (tiles, split)), key=lambda b: b[0])
    return best


def config_on_cuda(path: str) -> dict | None:
    """The model config at `path`, or None (said on stderr) where there is no CUDA device."""
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return None
    return json.loads(Path(path).read_text())


def projection_parser(doc: str, rows: str) -> argparse.ArgumentParser:
    """The options every projection bench takes: the model's config, the row counts, and
    which projections."""
    p = argparse.ArgumentParser(description=doc)
    p.add_argument("--model-config", default="target/model_config.json")
    p.add_argument("--rows", default=rows)
    p.add_argument("--only", default=None, help="comma-separated projection names")
    return p


def main() -> int:
    p = projection_parser(__doc__, "16,32,64,128,256,512")
    p.add_argument("--sweep", action="store_true", help="ours at each launch of SWEEP too")
    args = p.parse_args()
    config = config_on_cuda(args.model_config)
    if config is None:
        return 2
    device = torch.device("cuda")
    sms, pdl = device_sm_count(device), pdl_supported(device)
    with torch.no_grad():
        for name, (n, k) in projection_shapes(config).items():
            if args.only and name not in args.only.split(","):
                continue
            copies = copies_for(n * k * 2)
            weights = [torch.randn(n, k, device=device, dtype=torch.float16) * 0.02
                       for _ in range(copies)]  # fmt: skip
            for m in (int(r) for r in args.rows.split(",")):
                x = torch.randn(m, k, device=device, dtype=torch.float16)
                got = few_row_linear(x, weights[0], sm_count=sms).float()
                err = (got - F.linear(x, weights[0]).float()).abs().max().item()
                ours = functools.partial(few_row_linear, sm_count=sms)
                cublas, plain = (
                    graph_us(chain(F.linear, x, weights)),
                    graph_us(chain(ours, x, weights)),
                )
                row = f"{name:8s} {m:5d} rows: cuBLAS {cublas:6.2f}  ours {plain:6.2f}"
                row += f"  (weight at {n * k * 2 / cublas / 1e3:5.0f} GB/s on cuBLAS)"
                if args.sweep:
                    us, launch = best_launch(x, weights, sms)
                    row += f"  ours' best {us:6.2f} at {launch}"
                if pdl:
                    under = graph_us(chain(functools.partial(ours, pdl=True), x, weights))
                    row += f"  ours under PDL {under:6.2f}"
                print(f"{row}  (max |ours - cuBLAS| {err:.4f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
