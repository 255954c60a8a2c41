"""A preset's rendered engine timed on traces exactly like the grader (warm-up, a fresh engine
per repeat, only the engine calls timed), printing every repeat, not only the median: for A/B
runs where one slow repeat must be seen, not hidden.

    python scripts/trace_repeats.py --preset slab-triton-pdl-allgraphs --traces decode,mixed \\
        --repeat 9
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evaluator.benchmark import time_trace  # noqa: E402
from evaluator.benchmark_traces import get_trace  # noqa: E402
from evaluator.engine_loader import load_engine_module  # noqa: E402
from variants.presets import PRESETS  # noqa: E402
from variants.render import render_engine  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-config", default="target/model_config.json")
    p.add_argument("--weight-dir", default="target/weights")
    p.add_argument("--preset", default="slab-triton-pdl-allgraphs", choices=sorted(PRESETS))
    p.add_argument("--traces", default="prefill,decode,mixed")
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    config = json.loads(Path(args.model_config).read_text())
    path = render_engine(PRESETS[args.preset], Path(tempfile.mkdtemp()) / "engine.py")
    create = load_engine_module(path).create_engine
    for name in args.traces.split(","):
        trace = get_trace(name, config)
        r = time_trace(create, config, args.weight_dir, args.device, trace, repeat=args.repeat)
        every = [round(s * 1e3, 3) for s in r["all_seconds"]]
        print(f"{name}: median {r['seconds'] * 1e3:.3f} ms  {r['tokens_per_s']:,.0f} tok/s  "
              f"all ms {every}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
