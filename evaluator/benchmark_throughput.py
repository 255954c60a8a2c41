"""Throughput benchmark with the course's command line, timed like the grader, plus the floor.

    python evaluator/benchmark_throughput.py --engine workspace/engine.py --suite all

Prints JSON: per trace tokens/s, decode tokens/s, peak MiB, create_engine seconds, the physical
floor and the floor efficiency (floor / measured), and the ceilings used. Exits 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from evaluator.benchmark import time_trace  # noqa: E402
from evaluator.benchmark_traces import SUITES  # noqa: E402
from evaluator.engine_loader import (  # noqa: E402
    EngineLoadError,
    OneLineParser,
    check_cli,
    check_weight_dir,
    default_target_paths,
    load_engine_module,
    load_model_config,
)
from evaluator.floor import (  # noqa: E402
    dtype_bytes_for,
    floor_efficiency,
    measure_ceilings,
    trace_floor_seconds,
)

log = logging.getLogger("benchmark_throughput")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    config_path, weight_dir = default_target_paths(REPO_ROOT)
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--engine", required=True, help="engine file defining create_engine")
    p.add_argument("--model-config", default=str(config_path), help="model_config.json")
    p.add_argument("--weight-dir", default=str(weight_dir), help="directory holding model.pt")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    p.add_argument("--suite", choices=[*SUITES, "all"], default="public")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--bandwidth-gbs", type=float, help="memory bandwidth instead of measuring")
    p.add_argument("--tflops", type=float, help="matmul TFLOP/s instead of measuring")
    p.add_argument("--json", dest="json_path", help="also write the JSON report here")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        check_cli(args, positive=["bandwidth_gbs", "tflops"])
        if args.repeat < 1 or args.warmup < 0:
            raise EngineLoadError("--repeat must be >= 1 and --warmup >= 0")
        module = load_engine_module(args.engine)
        config = load_model_config(args.model_config)
        weight_dir = check_weight_dir(args.weight_dir)
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise EngineLoadError(f"device {args.device} requested but CUDA is not available")
    except (EngineLoadError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    suites = list(SUITES) if args.suite == "all" else [args.suite]
    traces = [trace for suite in suites for trace in SUITES[suite](config)]
    ceilings = measure_ceilings(device, bandwidth_gbs=args.bandwidth_gbs, tflops=args.tflops)
    log.info("ceilings: %s", ceilings)
    dtype_bytes = dtype_bytes_for(config, device)
    rows = {}
    for trace in tqdm(traces, desc="traces", disable=not sys.stderr.isatty()):
        try:
            result = time_trace(
                module.create_engine,
                config,
                weight_dir,
                device,
                trace,
                warmup=args.warmup,
                repeat=args.repeat,
            )
        except Exception as exc:  # the engine's fault, reported as the judge reports one
            log.debug("trace %s failed", trace.name, exc_info=True)
            print(f"FAILED trace {trace.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        floor_s = trace_floor_seconds(trace, config, ceilings, dtype_bytes)
        result["floor_s"] = floor_s
        result["floor_efficiency"] = floor_efficiency(floor_s, result["seconds"])
        rows[trace.name] = result
        log.info(
            "%s: %.0f tok/s, %.0f decode tok/s, floor efficiency %s",
            trace.name,
            result["tokens_per_s"],
            result["decode_tokens_per_s"],
            result["floor_efficiency"],
        )
    report = {
        "engine": str(Path(args.engine).resolve()),
        "device": str(device),
        "suite": args.suite,
        "ceilings": ceilings.to_dict(),
        "traces": rows,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_path:
        Path(args.json_path).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
