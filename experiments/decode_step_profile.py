"""Decode-step anatomy on the GPU: median step time at a batch and context, the GPU time of the
step's graph replayed back to back, the kernels one step launches (torch.profiler), and the host
time of a call, per variant."""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from variants import Variant, build_engine  # noqa: E402


def step_profile(config, weight_dir, fields: dict, batch: int, ctx: int, steps: int) -> dict:
    engine = build_engine(config, weight_dir, "cuda", Variant(**fields))
    gen = torch.Generator().manual_seed(0)
    ids = list(range(batch))
    prompts = [torch.randint(0, config["vocab_size"], (ctx,), generator=gen).cuda() for _ in ids]
    engine.prefill(ids, prompts)
    tokens = [
        torch.randint(0, config["vocab_size"], (batch,), generator=gen).cuda()
        for _ in range(steps + 5)
    ]
    for t in tokens[:5]:
        engine.decode(ids, t)
    torch.cuda.synchronize()
    replay = graph_replay_us(engine, batch, max(engine.lengths.values()))
    times = step_ms(engine, ids, tokens[5:])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        engine.decode(ids, tokens[0])
        torch.cuda.synchronize()
    kernels, busy, top = kernel_table(prof)
    # host cost of one call: its wall time with the GPU idle at entry (launches are async)
    host = []
    for t in tokens[5:25]:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.decode(ids, t)
        host.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return {
        "variant": fields,
        "batch": batch,
        "ctx": ctx,
        "step_ms_median": statistics.median(times),
        "step_ms_min": min(times),
        "graph_replay_us": replay,
        "kernels_per_step": len(kernels),
        "host_call_ms_median": statistics.median(host),
        "kernel_busy_us": busy,
        "top_kernels": top,
        "prefill": prefill_profile(engine, config, gen),
    }


def step_ms(engine, ids: list, tokens: list) -> list[float]:
    """The GPU milliseconds of each decode step of `ids`, one a token tensor of `tokens`."""
    times = []
    for t in tokens:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        engine.decode(ids, t)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def kernel_table(prof, top: int = 12) -> tuple:
    """The GPU activities of a profile, their summed time (us) and the `top` names by time."""
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict = {}
    for e in kernels:  # GPU time per kernel name, to see what the call spends it on
        n, us = by_name.get(e.name, (0, 0.0))
        by_name[e.name] = (n + 1, us + e.time_range.elapsed_us())
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    busy = round(sum(us for _, us in by_name.values()), 1)
    return kernels, busy, [{"name": k[:70], "count": n, "us": round(us, 1)}
                           for k, (n, us) in ranked]  # fmt: skip


def graph_replay_us(engine, batch: int, longest: int, replays: int = 100) -> dict | None:
    """The GPU time of one decode step alone (the captured graph of this batch and context
    replayed back to back, no host work between, per replay) and the host time of one replay
    call with the GPU idle (the graph launch). None without decode graphs."""
    graphs = engine.decode_runner
    if not hasattr(graphs, "graphs"):
        return None
    bucket = next(s for s in graphs.batches if s >= batch)
    graph = graphs.graphs[bucket, next(c for c in graphs.contexts if c >= longest)]
    for _ in range(5):
        graph.replay()
    gpu_us = replay_us(graph, replays)
    launch = []
    for _ in range(20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        launch.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return {"gpu_us": round(gpu_us, 1), "launch_us": round(statistics.median(launch), 1)}


def replay_us(graph, replays: int) -> float:
    """GPU microseconds a replay of `graph`, `replays` back to back between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / replays


def prefill_profile(engine, config, gen, shapes=((4, 128), (1, 2048), (8, 512))) -> list:
    """Median wall time of a prefill call (synchronised), its kernels and their GPU time."""
    rows = []
    for batch, length in shapes:
        ids = [10_000 + i for i in range(batch)]
        prompts = [torch.randint(0, config["vocab_size"], (length,), generator=gen).cuda()
                   for _ in ids]  # fmt: skip
        times = []
        for _ in range(12):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            engine.prefill(ids, prompts)  # a re-prefill replaces: same work each time
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            engine.prefill(ids, prompts)
            torch.cuda.synchronize()
        kernels, busy, top = kernel_table(prof)
        ms = statistics.median(times[2:])
        rows.append({"shape": f"{batch}x{length}", "ms_median": round(ms, 3),
                     "tokens_per_s": round(batch * length / ms * 1e3), "kernels": len(kernels),
                     "kernel_busy_us": busy, "top_kernels": top})  # fmt: skip
        engine.remove(ids)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-config", default="target/model_config.json")
    p.add_argument("--weight-dir", default="target/weights")
    p.add_argument("--variant", action="append", default=[], help="JSON fields; repeatable")
    p.add_argument("--shape", action="append", default=[], help="BATCHxCTX; repeatable")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA device", file=sys.stderr)
        return 2
    config = json.loads(Path(args.model_config).read_text())
    rows = []
    for fields in [json.loads(v) for v in args.variant] or [{}]:
        for shape in args.shape or ["8x150"]:
            batch, ctx = (int(x) for x in shape.split("x"))
            rows.append(step_profile(config, args.weight_dir, fields, batch, ctx, args.steps))
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
