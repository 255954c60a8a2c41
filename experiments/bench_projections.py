"""A layer's four projections on cuBLAS (F.linear) against our split-K kernel (`few_row_linear`,
plain and under PDL), at each row count: CUDA graphs of back-to-back GEMMs over enough weight
copies (at least 12, and 64 MiB: `bench_few_row.copies_for`) that L2 holds none of them, as in
a decode step; us a GEMM, median of 20 replays.

    python experiments/bench_projections.py --rows 16,32,48,64,128,256,512

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
    """name -> (N, K) of the model's fused projections."""
    h, i, d = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    return {"qkv": (q + 2 * kv, h), "output": (h, q), "gate-up": (2 * i, h), "down": (h, i)}


def chain(linear, x: torch.Tensor, weights: list) -> list:
    """The graph's calls: x through each weight copy in turn."""
    return [functools.partial(linear, x, w) for w in weights]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-config", default="target/model_config.json")
    p.add_argument("--rows", default="16,32,64,128,256,512")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    config = json.loads(Path(args.model_config).read_text())
    device = torch.device("cuda")
    sms, pdl = device_sm_count(device), pdl_supported(device)
    with torch.no_grad():
        for name, (n, k) in projection_shapes(config).items():
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
                if pdl:
                    under = graph_us(chain(functools.partial(ours, pdl=True), x, weights))
                    row += f"  ours under PDL {under:6.2f}"
                print(f"{row}  (max |ours - cuBLAS| {err:.4f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
