"""What one engine holds on a GPU, and the peak of the grader's pattern, per preset.

    python experiments/engine_memory.py --preset slab-triton-pdl-allgraphs --json memory.json

Per preset: the GPU memory a fresh engine holds (its weights, its KV cache, and the rest: CUDA
graph pools, static buffers, workspaces), whether it all goes when the last reference goes (the
cyclic collector off, as for the grader), and per trace the peak of the grader's pattern (a
warm-up engine and a fresh engine per repeat by assignment; evaluator/benchmark.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from evaluator.benchmark import time_trace  # noqa: E402
from evaluator.benchmark_traces import get_trace  # noqa: E402
from variants import build_engine  # noqa: E402
from variants.presets import PRESETS  # noqa: E402

MIB = 2**20


def anatomy(config: dict, weights: str, variant, budget_gib) -> dict:
    gc.collect()
    gc.disable()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    engine = build_engine(config, weights, "cuda", variant, memory_budget_gib=budget_gib)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    parts = {"weights": engine.model.weights.nbytes(), "kv_cache": engine.cache.memory_bytes()}
    parts["graphs_and_buffers"] = held - sum(parts.values())
    limit = engine.cache.limit_bytes
    engine = None
    torch.cuda.synchronize()
    left = torch.cuda.memory_allocated() - before
    gc.enable()
    return {
        "held_mib": held / MIB,
        **{f"{k}_mib": v / MIB for k, v in parts.items()},
        "cache_limit_mib": None if limit is None else limit / MIB,
        "left_after_last_reference_mib": left / MIB,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-config", default="target/model_config.json")
    p.add_argument("--weight-dir", default="target/weights")
    p.add_argument("--preset", action="append", choices=sorted(PRESETS), help="repeatable")
    p.add_argument("--traces", default="prefill,decode,mixed,decode_8x128,mixed_128,continuous")
    p.add_argument("--budget-gib", type=float, default=8.0, help="MEMORY_BUDGET_GIB (24 / 3)")
    p.add_argument("--json", dest="json_path")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA device", file=sys.stderr)
        return 2
    config = json.loads(Path(args.model_config).read_text())
    rows = []
    for name in args.preset or ["slab-triton-pdl-allgraphs"]:
        variant = PRESETS[name]
        row = {"preset": name, **anatomy(config, args.weight_dir, variant, args.budget_gib)}
        make = lambda c, w, d, v=variant: build_engine(
            c, w, d, v, memory_budget_gib=args.budget_gib
        )  # noqa: E731
        for trace in args.traces.split(","):
            timing = time_trace(make, config, args.weight_dir, "cuda", get_trace(trace, config),
                                warmup=1, repeat=2)  # fmt: skip
            row[f"grader_peak_mib_{trace}"] = timing["peak_mib"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
