"""Correctness test with the course's command line: compare an engine file with the reference.

    python evaluator/test_correctness.py --engine workspace/engine.py --device cuda --stress

Prints JSON per case (max abs error, share of the tolerance used, steps, failure); exits 1 naming
the first failing case and step, 2 on bad input. `--gate noise` judges in units of the model
dtype's own rounding noise instead (docs/CORRECTNESS_GATE.md); `--gate auto` picks the course's
check for the course's target and the noise gate otherwise, and says why.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from evaluator.correctness import CASES, check_engine  # noqa: E402
from evaluator.engine_loader import (  # noqa: E402
    EngineLoadError,
    OneLineParser,
    check_cli,
    check_weight_dir,
    default_target_paths,
    load_engine_module,
    load_model_config,
)
from evaluator.gate_choice import select_gate  # noqa: E402
from evaluator.gates import CourseGate, NoiseGate  # noqa: E402
from evaluator.reference_model import dtype_named  # noqa: E402

log = logging.getLogger("test_correctness")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    config_path, weight_dir = default_target_paths(REPO_ROOT)
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--engine", required=True, help="engine file defining create_engine")
    p.add_argument("--model-config", default=str(config_path), help="model_config.json")
    p.add_argument("--weight-dir", default=str(weight_dir), help="directory holding model.pt")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    p.add_argument("--atol", type=float, default=1e-2)
    p.add_argument("--rtol", type=float, default=1e-2)
    p.add_argument("--stress", action="store_true", help="add the stress case to public")
    p.add_argument("--cases", help=f"comma-separated cases ({','.join(CASES)}); overrides --stress")
    p.add_argument("--seed", type=int, default=0, help="stress trace and token seed")
    p.add_argument(
        "--stress-positions",
        type=int,
        help="end the stress case's longest request here instead of at the config's "
        "max_position_embeddings (a CPU's reference over the whole context takes long)",
    )
    p.add_argument(
        "--gate",
        choices=("course", "noise", "auto"),
        default="course",
        help="course: the grader's allclose (default); noise: error in units of the model "
        "dtype's rounding noise; auto: course for the course's target, else noise",
    )
    p.add_argument(
        "--noise-dtype",
        help="noise gate: the dtype whose noise is the unit (default: the reference's dtype "
        "for the device; float16/bfloat16 judge a CPU run in low precision)",
    )
    p.add_argument("--json", dest="json_path", help="also write the JSON report here")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def choose_gate(args: argparse.Namespace, config: dict):
    """(gate, one-line reason) from --gate, --atol/--rtol and --noise-dtype."""
    if args.gate == "auto":
        gate, reason = select_gate(args.model_config, config)
    elif args.gate == "course":
        gate, reason = CourseGate(), "course gate: asked for with --gate course"
    else:
        gate, reason = NoiseGate(), "noise gate: asked for with --gate noise"
    tol = {"atol": args.atol, "rtol": args.rtol}
    if gate.name == "course":
        if args.noise_dtype:
            raise EngineLoadError("--noise-dtype needs the noise gate, the course gate applies")
        return dataclasses.replace(gate, **tol), reason
    try:
        dtype_named(args.noise_dtype or "float32")
    except ValueError as exc:
        raise EngineLoadError(f"--noise-dtype: {exc}") from exc
    return dataclasses.replace(gate, **tol, dtype=args.noise_dtype), reason


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    cases = [c.strip() for c in args.cases.split(",") if c.strip()] if args.cases else None
    cases = cases or ["public"] + (["stress"] if args.stress else [])
    try:
        check_cli(args, at_least=[("atol", 0), ("rtol", 0), ("stress_positions", 16)])
        unknown = [c for c in cases if c not in CASES]
        if unknown:
            raise EngineLoadError(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
        module = load_engine_module(args.engine)
        config = load_model_config(args.model_config)
        weight_dir = check_weight_dir(args.weight_dir)
        if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
            raise EngineLoadError(f"device {args.device} requested but CUDA is not available")
        gate, reason = choose_gate(args, config)
    except (EngineLoadError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    log.info("%s", reason)
    results = check_engine(
        module.create_engine,
        config,
        weight_dir,
        args.device,
        atol=args.atol,
        rtol=args.rtol,
        cases=tuple(cases),
        seed=args.seed,
        gate=gate,
        stress_positions=args.stress_positions,
    )
    report = {"engine": str(Path(args.engine).resolve()), "device": args.device}
    report |= {"gate": gate.to_dict(), "gate_reason": reason, "cases": results}
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_path:
        Path(args.json_path).write_text(text + "\n")
    failed = [case for case, r in results.items() if not r["passed"]]
    if failed:
        print(f"FAILED case {failed[0]}: {results[failed[0]]['failure']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
