"""Host cost of the CUDA-graph paths' per-call index staging (`_fill`), on any machine: the
Python that builds positions, slots, tables and the prefill schedule, then one staging copy.
Runs on a CPU engine (one layer, paged64 and slab caches; decode at 8, 32 and 64 rows); prints
microseconds, the best of 5 timings of 200 calls each.

    python experiments/bench_host_fill.py [--json PATH]
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evaluator.toy_weights import save_toy_weights  # noqa: E402
from variants import Variant, build_engine  # noqa: E402
from variants.execution.cuda_graphs import DecodeGraphs  # noqa: E402
from variants.execution.prefill_graphs import PrefillGraphs  # noqa: E402


def best_us(fn, calls: int = 200, rounds: int = 5) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return round(min(times), 1)


def fill_costs(config: dict, weights: str, cache: str) -> dict:
    engine = build_engine(config, weights, "cpu", Variant(cache=cache, block_size=64))
    rids = list(range(64))
    for r in rids:
        engine.cache.allocate(r, 300)
    prefill, decode = PrefillGraphs(engine), DecodeGraphs(engine, "pow2")
    return {
        "cache": cache,
        "prefill_4x128_us": best_us(lambda: prefill._fill(rids[:4], [128] * 4, 512)),
        "prefill_8x32_us": best_us(lambda: prefill._fill(rids[:8], [32] * 8, 256)),
        "decode_b8_us": best_us(lambda: decode._fill(rids[:8], [149] * 8, 8)),
        "decode_b32_us": best_us(lambda: decode._fill(rids[:32], [299] * 32, 32)),
        "decode_b64_us": best_us(lambda: decode._fill(rids, [299] * 64, 64)),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-config", default="target/model_config.json")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    config = dict(json.loads(Path(args.model_config).read_text()), num_hidden_layers=1)
    weights = tempfile.mkdtemp()
    save_toy_weights(config, Path(weights) / "model.pt")
    rows = [fill_costs(config, weights, cache) for cache in ("paged", "slab")]
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
