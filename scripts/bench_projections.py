"""A layer's four projections on cuBLAS (F.linear) against our split-K kernel (`few_row_linear`,
plain and under PDL), at each row count: CUDA graphs of 12 back-to-back GEMMs over 12 weight
copies (so no weight stays in L2 from the one before), us a GEMM, median of 15 replays.

    python scripts/bench_projections.py --rows 16,32,48,64,128,256,512

Isolated chains flatter PDL: in a decode step the other kernels already launch under it
(docs/PERF.md, runs 178-179)."""

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from variants.kernels.device import device_sm_count  # noqa: E402
from variants.kernels.few_row_linear import few_row_linear  # noqa: E402
from variants.kernels.pdl import pdl_supported  # noqa: E402

COPIES = 12


def projection_shapes(config: dict) -> dict:
    """name -> (N, K) of the model's fused projections."""
    h, i, d = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    return {"qkv": (q + 2 * kv, h), "output": (h, q), "gate-up": (2 * i, h), "down": (h, i)}


def chain(linear, x: torch.Tensor, weights: list):
    """One call: x through each weight copy in turn."""
    return lambda: [linear(x, w) for w in weights]


def graph_us(fn, replays: int = 15) -> float:
    """GPU us of one call of `fn` (which runs COPIES GEMMs), captured and replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up: compiled, workspaces allocated
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / COPIES)
    return statistics.median(times)


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
            weights = [torch.randn(n, k, device=device, dtype=torch.float16) * 0.02
                       for _ in range(COPIES)]  # fmt: skip
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
