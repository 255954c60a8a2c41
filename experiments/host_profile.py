"""Where a call's host time goes: the Python and torch work between the grader's call and the
return, function by function.

One engine runs a trace's calls `--repeat` times (each trace ends with its removes, so the engine
is back where it began), with `torch.cuda.synchronize()` between repeats as the grader has. It
prints the median host time of each call kind without a profiler, then cProfile's view of the
same calls: the functions with the most time of their own, per call of the kind asked for. cProfile
slows Python-heavy code more than torch calls: read its numbers as shares, the medians as times.

    python experiments/host_profile.py --variant '{"cache": "paged", ...}' [--trace prefill]
        [--kind prefill] [--repeat 200] [--json PATH]
"""

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evaluator.benchmark_traces import get_trace  # noqa: E402
from evaluator.traces import materialize  # noqa: E402
from variants import Variant, build_engine  # noqa: E402


def run_once(engine, calls: list, times: dict, profiler=None, profiled_kind=None) -> None:
    """The trace's calls, timing each on the host (no sync inside, as the grader); the profiler
    sees only the calls of `profiled_kind`."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    for kind, *args in calls:
        fn = getattr(engine, kind)
        watched = profiler is not None and kind == profiled_kind
        if watched:
            profiler.enable()
        start = time.perf_counter()
        fn(*args)
        times.setdefault(kind, []).append((time.perf_counter() - start) * 1e6)
        if watched:
            profiler.disable()
    sync()


def time_tables(profiler, calls: int, top: int) -> dict:
    """The `top` functions by their own time, in us per call, with their inclusive time; and the
    `top` Python functions by inclusive time (the call tree's upper levels)."""
    stats = pstats.Stats(profiler)
    rows = []
    for (file, line, name), (_, ncalls, tottime, cumtime, _) in stats.stats.items():
        where = name if file == "~" else f"{Path(file).name}:{line}:{name}"
        rows.append({"function": where, "calls_per_call": round(ncalls / calls, 2),
                     "own_us": round(tottime / calls * 1e6, 1),
                     "inclusive_us": round(cumtime / calls * 1e6, 1)})  # fmt: skip
    python = [r for r in rows if ":" in r["function"]]
    return {"own": sorted(rows, key=lambda r: -r["own_us"])[:top],
            "inclusive": sorted(python, key=lambda r: -r["inclusive_us"])[:top]}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-config", default="target/model_config.json")
    p.add_argument("--weight-dir", default="target/weights")
    p.add_argument("--variant", required=True, help="JSON fields")
    p.add_argument("--trace", action="append", default=[], help="trace name; repeatable")
    p.add_argument("--kind", default="prefill", help="the call kind cProfile looks at")
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--json", default=None)
    p.add_argument("--device", default="cuda", help="cpu only to try the script out")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: needs a CUDA device", file=sys.stderr)
        return 2
    config = json.loads(Path(args.model_config).read_text())
    engine = build_engine(config, args.weight_dir, args.device, Variant(**json.loads(args.variant)))
    out = []
    with torch.no_grad():
        for name in args.trace or ["prefill", "decode"]:
            calls = materialize(get_trace(name, config), int(config["vocab_size"]), args.device, 0)
            run_once(engine, calls, {})  # warm-up
            times: dict = {}
            for _ in range(args.repeat):
                run_once(engine, calls, times)
            profiled = [c for c in calls if c[0] == args.kind]
            profiler = cProfile.Profile()
            for _ in range(args.repeat):
                run_once(engine, calls, {}, profiler, args.kind)
            out.append({
                "trace": name,
                "host_us_median": {k: round(statistics.median(v), 1) for k, v in times.items()},
                "calls_per_repeat": {k: len(v) // args.repeat for k, v in times.items()},
                "profiled_kind": args.kind,
                **(time_tables(profiler, len(profiled) * args.repeat, args.top)
                   if profiled else {}),
            })  # fmt: skip
            print(json.dumps(out[-1], indent=1), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
