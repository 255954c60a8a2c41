"""Two or more engine files timed against each other on a few traces, in the grader's protocol
(`evaluator.benchmark.time_trace`: a warm-up engine, then a fresh engine per repeat), each run in
a fresh process, the engines alternating (each round starts one engine later); medians over the
rounds, each against the first engine's. Faster than `benchmark_throughput.py` over whole suites
where a change touches a few traces (a 1B model's public suite is most of a minute a process).

    python experiments/engine_ab.py A.py B.py [--traces mixed,decode] [--rounds 5]
        [--model-config C] [--weight-dir W] [--device cuda] [--jsonl rows.jsonl]"""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def one(engine: str, config_path: str, weight_dir: str, traces: list, device: str) -> dict:
    """trace -> median ms of its engine calls, for one engine in this process."""
    import torch

    from evaluator.benchmark import time_trace
    from evaluator.benchmark_traces import get_trace
    from evaluator.engine_loader import load_engine_module

    config = json.loads(Path(config_path).read_text())
    create = load_engine_module(engine).create_engine
    with torch.no_grad():
        return {
            name: time_trace(create, config, weight_dir, device, get_trace(name, config))["seconds"]
            * 1e3
            for name in traces
        }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("engines", nargs="+")
    p.add_argument("--traces", default="mixed,decode")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--model-config", default="target/model_config.json")
    p.add_argument("--weight-dir", default="target/weights")
    p.add_argument("--device", default="cuda")
    p.add_argument("--jsonl", default=None, help="also append each run's row here")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child's run
    args = p.parse_args()
    traces = args.traces.split(",")
    if args.one:
        print(
            json.dumps(
                one(args.engines[0], args.model_config, args.weight_dir, traces, args.device)
            )
        )
        return 0
    runs: dict = {e: [] for e in args.engines}
    for r in range(args.rounds):
        order = args.engines[r % len(args.engines) :] + args.engines[: r % len(args.engines)]
        for engine in order:
            child = [sys.executable, __file__, engine, "--one", "--traces", args.traces,
                     "--model-config", args.model_config, "--weight-dir", args.weight_dir,
                     "--device", args.device]  # fmt: skip
            done = subprocess.run(child, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"round {r + 1}, {engine}: failed\n{done.stderr[-2000:]}", flush=True)
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            runs[engine].append(row)
            print(f"round {r + 1} {engine}: " + ", ".join(f"{t} {ms:.3f}" for t, ms in row.items()),
                  flush=True)  # fmt: skip
            if args.jsonl:
                with open(args.jsonl, "a") as f:
                    f.write(json.dumps({"round": r + 1, "engine": engine, **row}) + "\n")
    base = args.engines[0]
    for t in traces:
        cells = []
        base_ms = statistics.median(row[t] for row in runs[base]) if runs[base] else None
        for engine, rows in runs.items():
            if not rows:
                continue
            ms = [row[t] for row in rows]
            med = statistics.median(ms)
            ratio = f" ({med / base_ms:.3f}x)" if base_ms and engine != base else ""
            cells.append(f"{Path(engine).stem} {med:.3f}{ratio} [{min(ms):.3f}-{max(ms):.3f}]")
        print(f"{t:14s} ms, medians of {args.rounds}: " + "; ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
