"""Host time of one CUDA-graph launch (`replay()` with the GPU idle), by what the graph holds.

A decode graph of our Triton kernels (71 nodes at batch 8) launched in 4-9 us on the H200, the
batch-64 one (132 nodes, with cuBLAS GEMMs) in 40-120 us, and a prefill graph's replay showed
up at 100-280 us in host profiles. This captures graphs of one kind of node each, at two counts,
and reports the median host time of a replay:

    python experiments/graph_launch.py [--json PATH]
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def launch_us(body) -> dict:
    """Capture body() once, then replay_us."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            body()
    torch.cuda.current_stream().wait_stream(stream)
    return replay_us(graph)


def replay_us(graph, repeats: int = 30) -> dict:
    """The median host time of replay() with the GPU idle, and the GPU time of one replay."""
    for _ in range(3):
        graph.replay()
    host = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        host.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return {"launch_us": round(statistics.median(host), 1),
            "gpu_us": round(start.elapsed_time(end) * 1e3, 1)}  # fmt: skip


def cases() -> dict:
    from variants.kernels.few_row_linear import few_row_linear

    dev, dt = "cuda", torch.float16
    x8 = torch.randn(8, 768, device=dev, dtype=dt)
    x512 = torch.randn(512, 768, device=dev, dtype=dt)
    x64 = torch.randn(64, 768, device=dev, dtype=dt)
    w = torch.randn(768, 768, device=dev, dtype=dt)
    w4 = torch.randn(3072, 768, device=dev, dtype=dt)
    small = torch.zeros(64, device=dev)
    other = torch.ones(64, device=dev)

    def repeat(fn, n):
        return lambda: [fn() for _ in range(n)]

    found = {}
    for n in (70, 130):
        found[f"triton few_row_linear x{n}"] = repeat(lambda: few_row_linear(x8, w), n)
        found[f"cublas mm 512x768x768 x{n}"] = repeat(lambda: x512 @ w.T, n)
        found[f"cublas mm 512x768x3072 x{n}"] = repeat(lambda: x512 @ w4.T, n)
        found[f"cublas mm 64x768x768 x{n}"] = repeat(lambda: x64 @ w.T, n)
        found[f"torch add x{n}"] = repeat(lambda: small.add_(1), n)
        found[f"memset x{n}"] = repeat(lambda: small.zero_(), n)
        found[f"device copy x{n}"] = repeat(lambda: small.copy_(other), n)
    return found


def engine_graphs(variant: str) -> dict:
    """replay_us of the engine's own graphs: prefill buckets of 512 and 2048 tokens, decode
    batches 8 and 64 (at the longest context)."""
    from variants import Variant, build_engine

    config = json.loads(Path("target/model_config.json").read_text())
    engine = build_engine(config, "target/weights", "cuda", Variant(**json.loads(variant)))
    decode = engine.decode_runner
    prefill = engine.prefill_runner
    found = {}  # each graph's inputs in their padding state first, as a capture leaves them
    for t in (512, 2048):
        prefill._fill([], [], t)
        torch.cuda.synchronize()
        found[f"engine prefill bucket {t}"] = replay_us(prefill.graphs[t])
    for b in (8, 64):
        decode._fill([], [], b)
        torch.cuda.synchronize()
        found[f"engine decode batch {b}"] = replay_us(decode.graphs[b, decode.contexts[-1]])
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", default=None)
    p.add_argument("--variant", default=None, help="JSON fields: also time the engine's graphs")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA device", file=sys.stderr)
        return 2
    rows = []
    for name, body in cases().items():
        rows.append({"graph": name, **launch_us(body)})
        print(json.dumps(rows[-1]), flush=True)
    if args.variant:
        for name, times in engine_graphs(args.variant).items():
            rows.append({"graph": name, **times})
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
