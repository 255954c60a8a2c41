"""Where a timed trace's wall time goes: host work the GPU waits for, or GPU work.

For each trace, on a fresh engine after one warm-up engine (the grader's protocol): the timed
wall time (median of repeats); call by call without the profiler (CUDA events around each call,
medians over fresh engines), the GPU's span of the call and its idle gap before it; and from one
profiled run per trace, call by call, the host time of the call, the GPU's busy time (the union
of its kernels' intervals) and the kernels with the most GPU time in each call. A trace whose GPU
idles for much of its wall time is bound by the host. The profiler's own host work stretches the
profiled run (most of all its first call): the gaps come from the unprofiled runs. Optionally
writes each profiled run as a Chrome trace (`--chrome DIR`). The engine: an assembly (`--variant
JSON`), or a written engine.py with its kernel tables (`--engine FILE`)."""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evaluator.benchmark import run_calls  # noqa: E402
from evaluator.benchmark_traces import get_trace  # noqa: E402
from evaluator.engine_loader import load_engine_module  # noqa: E402
from evaluator.traces import materialize  # noqa: E402
from variants import Variant, build_engine  # noqa: E402


def busy_union(intervals: list) -> float:
    """Total length covered by (start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def top_kernels(kernels: list, n: int = 12) -> list:
    """The kernel names with the most GPU time: count and total us."""
    by_name: dict = {}
    for k in kernels:
        count, us = by_name.get(k["name"], (0, 0.0))
        by_name[k["name"]] = (count + 1, us + k["dur"])
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:n]
    return [{"name": name[:80], "count": c, "us": round(us, 1)} for name, (c, us) in ranked]


def timed_wall(build, calls, repeat: int) -> list:
    times = []
    for _ in range(repeat):
        engine = build()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run_calls(engine, calls)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def event_calls(build, calls, repeat: int) -> tuple:
    """Per call, medians over `repeat` fresh engines without the profiler: the GPU's span of the
    call (an event recorded before it to one after) and its gap before it (since the previous
    call's end, or the run's first event): the time the GPU waited for the host."""
    spans, gaps = [[] for _ in calls], [[] for _ in calls]
    for _ in range(repeat):
        engine = build()
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(2 * len(calls) + 1)]
        marks[0].record()
        for i, call in enumerate(calls):
            marks[2 * i + 1].record()
            run_calls(engine, [call])
            marks[2 * i + 2].record()
        torch.cuda.synchronize()
        for i in range(len(calls)):
            gaps[i].append(marks[2 * i].elapsed_time(marks[2 * i + 1]))
            spans[i].append(marks[2 * i + 1].elapsed_time(marks[2 * i + 2]))
        engine = None
    med = [(statistics.median(s), statistics.median(g)) for s, g in zip(spans, gaps)]
    return [round(s, 3) for s, _ in med], [round(g, 3) for _, g in med]


def profiled_calls(engine, calls, chrome_path: Path) -> tuple:
    """Per call: kind, rows, host ms, and the GPU busy ms and count of the kernels it launched
    (a kernel belongs to the call whose span holds its launch: the Chrome trace's correlation)."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as prof:
        for i, call in enumerate(calls):
            with torch.profiler.record_function(f"call{i}"):
                run_calls(engine, [call])
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(chrome_path))
    events = json.loads(chrome_path.read_text())["traceEvents"]
    spans = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("cat") == "user_annotation" and e["name"].startswith("call")}  # fmt: skip
    launches = {e["args"].get("correlation"): e["ts"] for e in events
                if e.get("cat") == "cuda_runtime"}  # fmt: skip
    kernels = [e for e in events if e.get("cat") == "kernel"]
    rows = []
    for i, call in enumerate(calls):
        start, end = spans[f"call{i}"]
        mine = [(k["ts"], k["ts"] + k["dur"]) for k in kernels
                if start <= launches.get(k["args"].get("correlation"), -1) <= end]  # fmt: skip
        own = [k for k in kernels if start <= launches.get(k["args"].get("correlation"), -1) <= end]
        tokens = sum(t.numel() for t in call[2]) if call[0] == "prefill" else len(call[1])
        rows.append({
            "call": i, "kind": call[0], "rows": len(call[1]), "tokens": int(tokens),
            "host_ms": round((end - start) / 1e3, 3),
            "gpu_busy_ms": round(busy_union(mine) / 1e3, 3), "kernels": len(mine),
            "top_kernels": top_kernels(own, 8),
        })  # fmt: skip
    first = min(s for s, _ in spans.values())
    last = max([k["ts"] + k["dur"] for k in kernels] + [e for _, e in spans.values()])
    intervals = [(k["ts"], k["ts"] + k["dur"]) for k in kernels]
    summary = {
        "profiled_wall_ms": round((last - first) / 1e3, 3),
        "gpu_busy_ms": round(busy_union(intervals) / 1e3, 3),
        "first_kernel_after_ms": round(
            (min([k["ts"] for k in kernels] or [first]) - first) / 1e3, 3
        ),
        "host_ms": round(sum(r["host_ms"] for r in rows), 3),
        "kernels": len(kernels),
        "top_kernels": top_kernels(kernels),
    }
    return rows, summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-config", default="target/model_config.json")
    p.add_argument("--weight-dir", default="target/weights")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--variant", help="an assembly's JSON fields")
    which.add_argument("--engine", help="a written engine.py (its tables included)")
    p.add_argument("--trace", action="append", default=[], help="trace name; repeatable")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--chrome", default=None, help="a folder for Chrome traces")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA device", file=sys.stderr)
        return 2
    config = json.loads(Path(args.model_config).read_text())
    fields = json.loads(args.variant) if args.variant else {"engine": args.engine}
    if args.engine:
        create_engine = load_engine_module(args.engine).create_engine
    else:

        def create_engine(config, weight_dir, device):
            return build_engine(config, weight_dir, device, Variant(**fields))

    def build():
        engine = create_engine(config, args.weight_dir, "cuda")
        torch.cuda.synchronize()
        return engine

    out = []
    with torch.no_grad():
        for name in args.trace or ["prefill", "decode", "mixed"]:
            calls = materialize(get_trace(name, config), int(config["vocab_size"]), "cuda", 0)
            run_calls(build(), calls)  # warm-up engine
            walls = timed_wall(build, calls, args.repeat)
            spans, gaps = event_calls(build, calls, args.repeat)
            chrome = Path(args.chrome or tempfile.mkdtemp()) / f"{name}.json"
            chrome.parent.mkdir(parents=True, exist_ok=True)
            rows, summary = profiled_calls(build(), calls, chrome)
            for row, span, gap in zip(rows, spans, gaps):
                row.update(span_ms=span, gap_ms=gap)
            summary.update(span_ms=round(sum(spans), 3), gpu_waited_ms=round(sum(gaps), 3))
            out.append({"trace": name, "variant": fields, "wall_ms_median":
                        round(statistics.median(walls), 3), "wall_ms": [round(w, 3) for w in walls],
                        **summary, "calls": rows})  # fmt: skip
            print(json.dumps(out[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
