"""Where a trace whose KV pool moves spends its time: the trace's wall time on fresh engines
(after a warm-up engine), then call by call with the pool's resizes and the graphs' captures
inside it timed (synchronised on both sides: what they cost the call), the instantiation and
the first replay (the upload) apart. `--ab`: the prefill graphs' eager first call after a move
against a capture on that call, fresh engines alternating.

    python experiments/move_cost.py --trace long_prompts --budget-gib 8 [--ab --repeat 9]"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evaluator.benchmark import run_calls  # noqa: E402
from evaluator.benchmark_traces import get_trace  # noqa: E402
from evaluator.traces import materialize  # noqa: E402
from variants import Variant, build_engine  # noqa: E402
from variants.cache import slab  # noqa: E402
from variants.execution import cuda_graphs  # noqa: E402

SPENT: dict = {}


def timed(cls, name: str, label: str, sync: bool = True) -> None:
    """`cls.name` wrapped: its wall time (synchronised on both sides, with `sync`) added to
    SPENT[label]."""
    inner = getattr(cls, name)

    def wrapper(*args, **kwargs):
        if sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            if sync:
                torch.cuda.synchronize()
            SPENT[label] = SPENT.get(label, 0.0) + (time.perf_counter() - t0) * 1e3

    setattr(cls, name, wrapper)


class Everything(set):
    """A set that holds every bucket: the prefill graphs then capture on a moved bucket's first
    call (the policy before the eager first call)."""

    def __contains__(self, item) -> bool:
        return True


@torch.no_grad()
def ab(build, config: dict, args) -> int:
    walls: dict = {"eager-first": [], "capture-first": []}
    for name in args.trace or ["long_prompts"]:
        calls = materialize(get_trace(name, config), int(config["vocab_size"]), "cuda", 0)
        run_calls(build(), calls)  # warm-up engine
        for _ in range(args.repeat):
            for policy, times in walls.items():
                engine = build()
                if policy == "capture-first":
                    engine.prefill_runner.asked = Everything()
                t0 = time.perf_counter()
                run_calls(engine, calls)
                torch.cuda.synchronize()
                times.append(round((time.perf_counter() - t0) * 1e3, 2))
                del engine
        for policy, times in walls.items():
            median = round(statistics.median(times), 2)
            print(json.dumps({"trace": name, "policy": policy, "median": median, "ms": times}))
            times.clear()
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-config", default="target/model_config.json")
    p.add_argument("--weight-dir", default="target/weights")
    p.add_argument("--variant", default='{"cache":"slab","attention":"triton",'
                   '"layers":"fused-pdl","graphs":"pow2","prefill_graphs":"pow2"}')  # fmt: skip
    p.add_argument("--trace", action="append", default=[])
    p.add_argument("--budget-gib", type=float, default=8.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--ab", action="store_true",
                   help="only the trace's wall time, fresh engines alternating between the prefill "
                   "graphs' eager first call after a move and a capture on that call")  # fmt: skip
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA device (run it on the GPU)", file=sys.stderr)
        return 2
    config = json.loads(Path(args.model_config).read_text())
    fields = json.loads(args.variant)

    def build():
        engine = build_engine(
            config, args.weight_dir, "cuda", Variant(**fields), memory_budget_gib=args.budget_gib
        )
        torch.cuda.synchronize()
        return engine

    if args.ab:
        return ab(build, config, args)
    with torch.no_grad():
        for name in args.trace or ["long_prompts"]:
            calls = materialize(get_trace(name, config), int(config["vocab_size"]), "cuda", 0)
            run_calls(build(), calls)  # warm-up engine
            plain = []
            for _ in range(args.repeat):
                engine = build()
                t0 = time.perf_counter()
                run_calls(engine, calls)
                torch.cuda.synchronize()
                plain.append((time.perf_counter() - t0) * 1e3)
                del engine
            walls = [round(w, 2) for w in plain]
            median = round(statistics.median(plain), 2)
            print(json.dumps({"trace": name, "wall_ms": walls, "median": median}), flush=True)
    # the same trace with its pieces timed (synchronising adds a little)
    timed(slab.SlabKVCache, "_resize", "resize")
    timed(cuda_graphs.GraphRunner, "_graph", "capture")
    timed(torch.cuda.CUDAGraph, "capture_end", "instantiate", sync=False)
    timed(torch.cuda.CUDAGraph, "replay", "replay")
    with torch.no_grad():
        for name in args.trace or ["long_prompts"]:
            calls = materialize(get_trace(name, config), int(config["vocab_size"]), "cuda", 0)
            for _ in range(args.repeat):
                engine = build()
                SPENT.clear()
                rows = []
                for i, call in enumerate(calls):
                    before = dict(SPENT)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    run_calls(engine, [call])
                    torch.cuda.synchronize()
                    ms = (time.perf_counter() - t0) * 1e3
                    extra = {k: round(v - before.get(k, 0.0), 2) for k, v in SPENT.items()
                             if v != before.get(k, 0.0)}  # fmt: skip
                    if extra or i < 2:
                        rows.append({"call": i, "kind": call[0], "rows": len(call[1]),
                                     "ms": round(ms, 2), **extra})  # fmt: skip
                print(json.dumps({"trace": name, "pieces": rows,
                                  "spent": {k: round(v, 2) for k, v in SPENT.items()},
                                  "calls": len(calls)}), flush=True)  # fmt: skip
                del engine
    return 0


if __name__ == "__main__":
    sys.exit(main())
