"""What replacing an engine costs the next timed pass: a preset's engine timed on a trace after
each of three ways of making the next engine, medians of many repeats, and each call's own time.

    python experiments/replacement_cost.py --preset slab-triton-pdl-allgraphs --traces prefill,mixed

- `assign`: the grader's pattern, `engine = create_engine(...)`; the old engine is freed by
  that assignment, just before the timed pass.
- `settled`: the same, then a collection, an emptied cache, a device sync and 50 ms of sleep
  before the timed pass (the old engine's freeing is over when the timer starts).
- `kept`: every engine stays alive (nothing is freed before the timed pass).
- `idle`: as `kept`, then the host sleeps 6 ms (about what an assignment's free takes) before
  the timed pass: the device's idle gap alone, with nothing freed.
- `busy`: as `assign`, then the device kept busy for 20 ms (a spin kernel) before the timed
  pass: if this matches `kept`, what `assign` loses is the device's idle gap while the host
  frees (its clocks drop), not work the free leaves to the pass.
- `parked`: as `assign`, but the last engine's graphs are taken out of it before the
  assignment and destroyed before the next engine is made (outside any timed pass): what an
  engine would gain by handing its graphs to the next one's construction to free.
- `deferred`: as `parked`, but the whole last engine is held until the next engine is made and
  freed there: what an engine would gain by leaving its whole free (cache, weights, graphs) to
  the next `create_engine` (the pattern's peak is the same: that engine is alive while the
  next is made in every mode).

If `assign` is slower than the other two, the time goes to freeing the last engine; the
per-call columns say which call pays it. The cyclic collector is off throughout, as in
evaluator/benchmark.py.
"""

import argparse
import gc
import itertools
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
from variants.presets import PRESETS  # noqa: E402
from variants.render import render_engine  # noqa: E402

MODES = ("assign", "settled", "kept", "idle", "busy", "parked", "deferred")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_calls(engine, calls: list, device: torch.device) -> list:
    """Each call's seconds, the device synchronised after each."""
    seconds = []
    for call in calls:
        start = time.perf_counter()
        run_calls(engine, [call])
        sync(device)
        seconds.append(time.perf_counter() - start)
    return seconds


def measure(create, config, weights, device, calls, mode: str, repeat: int) -> dict:
    kept, passes, per_call, frees = [], [], [], []
    engine = create(config, weights, str(device))
    run_calls(engine, calls)  # the warm-up pass
    parked: list = []
    for _ in range(repeat):
        if mode in ("kept", "idle"):
            kept.append(engine)
        parked.clear()  # the engine before last (or its graphs), freed before the next is made
        new = create(config, weights, str(device))
        if mode == "parked":
            parked.extend(take_graphs(engine))
        if mode == "deferred":
            parked.append(engine)
        start = time.perf_counter()
        engine = new  # the last engine is freed here (unless kept)
        frees.append(time.perf_counter() - start)
        del new
        if mode == "busy" and device.type == "cuda":
            torch.cuda._sleep(40_000_000)  # 40M cycles: ~20 ms at the H200's 1.98 GHz
        if mode == "idle":
            time.sleep(0.006)
        if mode == "settled":
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            sync(device)
            time.sleep(0.05)
        sync(device)
        start = time.perf_counter()
        run_calls(engine, calls)
        sync(device)
        passes.append(time.perf_counter() - start)
    kept.clear()
    parked.clear()
    for _ in range(repeat if mode == "assign" else 0):  # call by call, after an assignment
        engine = create(config, weights, str(device))
        per_call.append(timed_calls(engine, calls, device))
    return {
        "pass_ms": round(1e3 * statistics.median(passes), 4),
        "passes_ms": [round(1e3 * s, 4) for s in passes],
        "free_ms": round(1e3 * statistics.median(frees), 3),  # the assignment's host time
        # (assign only) each call of a fresh engine's pass, synchronised after each call
        "call_ms": [round(1e3 * statistics.median(c), 4) for c in zip(*per_call)],
    }


def take_graphs(engine) -> list:
    """The engine's captured graphs, taken out of its runners (which it no longer replays)."""
    taken = []
    for name in ("decode_runner", "prefill_runner"):
        runner = getattr(engine, name, None)
        for graphs in [getattr(runner, a, {}) for a in ("graphs", "heads")] if runner else []:
            taken.extend(graphs.values())
            graphs.clear()
    return taken


def free_anatomy(create, config, weights, device, calls) -> dict:
    """Where an engine's free goes (host ms): its decode graphs, its prefill graphs, the rest."""
    engine = create(config, weights, str(device))
    run_calls(engine, calls)
    sync(device)
    parts = {}
    for name in ("decode_runner", "prefill_runner"):
        runner = getattr(engine, name, None)
        graphs = [getattr(runner, a, {}) for a in ("graphs", "heads")] if runner else []
        start = time.perf_counter()
        count = sum(len(g) for g in graphs)
        for g in graphs:
            g.clear()
        parts[f"{name} ({count})"] = round(1e3 * (time.perf_counter() - start), 3)
    start = time.perf_counter()
    engine = None
    parts["the rest"] = round(1e3 * (time.perf_counter() - start), 3)
    return parts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-config", default="target/model_config.json")
    p.add_argument("--weight-dir", default="target/weights")
    p.add_argument("--preset", default="slab-triton-pdl-allgraphs", choices=sorted(PRESETS))
    p.add_argument("--traces", default="prefill,mixed")
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="the modes in turn this many times, --repeat passes each (drift evens out)",
    )
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args()
    modes = args.modes.split(",")
    if not set(modes) <= set(MODES):
        p.error(f"--modes: {', '.join(sorted(set(modes) - set(MODES)))} not of {', '.join(MODES)}")
    config = json.loads(Path(args.model_config).read_text())
    device = torch.device(args.device)
    path = render_engine(PRESETS[args.preset], Path(tempfile.mkdtemp()) / "engine.py")
    create = load_engine_module(path).create_engine
    results: dict = {}
    gc.disable()
    with torch.no_grad():
        for name in args.traces.split(","):
            calls = materialize(get_trace(name, config), int(config["vocab_size"]), device)
            results[f"{name}/free_ms"] = parts = free_anatomy(
                create, config, args.weight_dir, device, calls
            )
            print(f"{name:8s} free ms {parts}", flush=True)
            for n, mode in itertools.product(range(args.rounds), modes):  # modes alternate
                row = measure(create, config, args.weight_dir, device, calls, mode, args.repeat)
                if n:  # another round: its passes join the earlier ones' median
                    passes = results[f"{name}/{mode}"]["passes_ms"] + row["passes_ms"]
                    row["passes_ms"], row["pass_ms"] = passes, statistics.median(passes)
                results[f"{name}/{mode}"] = row
                print(f"{name:8s} {mode:8s} round {n + 1}: pass {row['pass_ms']:.4f} ms (all "
                      f"rounds) free {row['free_ms']} ms  calls {row['call_ms']}",
                      flush=True)  # fmt: skip
                gc.collect()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
