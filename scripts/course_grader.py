"""Run the course's own evaluator on an engine, as its grader does, on a GPU of the grader's size.

    git clone https://github.com/hewanglanhao/stage3 /tmp/stage3
    python scripts/course_grader.py --skeleton /tmp/stage3 --engine workspace/engine.py \
        --memory-cap-gib 24 --json grader.json

Each of the skeleton's `evaluator/test_correctness.py` and `evaluator/benchmark_throughput.py`
runs unchanged in a fresh process, the process capped at `--memory-cap-gib` of GPU memory
(`torch.cuda.set_per_process_memory_fraction`: an H200 then runs out where an RTX 3090 would).
Prints one line per script and writes their JSON (per benchmark case: ms, tokens/s, peak MiB).
Exits non-zero when either script fails. Nothing of the skeleton is copied into this project.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
from evaluator.engine_loader import OneLineParser, out_of_range  # noqa: E402

# The child: cap the GPU memory, then run the script as `python script args` would.
CAPPED = """
import os, runpy, sys
import torch
gib, script = float(sys.argv[1]), sys.argv[2]
if gib > 0 and torch.cuda.is_available():
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gib * 2**30 / total))
sys.argv = [script, *sys.argv[3:]]
sys.path.insert(0, os.path.dirname(script))
runpy.run_path(script, run_name="__main__")
"""


def run_capped(script: Path, args: list[str], cap_gib: float, timeout_s: float) -> dict:
    cmd = [sys.executable, "-c", CAPPED, str(cap_gib), str(script), *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"script": script.name, "rc": None, "error": f"timed out after {timeout_s:.0f} s"}
    out = {"script": script.name, "rc": proc.returncode}
    text = proc.stdout.strip()
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    try:
        out["result"] = json.loads(text[start:]) if start >= 0 else None
    except ValueError:
        out["result"] = None
    if proc.returncode != 0:
        out["error"] = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        out["stderr_tail"] = proc.stderr[-3000:]
    return out


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--skeleton", required=True, help="a checkout of the course's stage3 skeleton")
    p.add_argument("--engine", required=True, help="the engine file to grade")
    p.add_argument("--model-config", default=str(REPO_ROOT / "target" / "model_config.json"))
    p.add_argument("--weight-dir", default=str(REPO_ROOT / "target" / "weights"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--memory-cap-gib", type=float, default=24.0, help="0: no cap (default 24)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per script")
    p.add_argument("--json", dest="json_path", help="write both scripts' results here")
    args = p.parse_args(argv)
    evaluator = Path(args.skeleton) / "evaluator"
    scripts = [evaluator / "test_correctness.py", evaluator / "benchmark_throughput.py"]
    problem = None
    if missing := [str(s) for s in scripts if not s.is_file()]:
        problem = f"not a stage3 skeleton: missing {', '.join(missing)}"
    elif not Path(args.engine).is_file():
        problem = f"--engine {args.engine}: no such file"
    elif out_of_range(args.memory_cap_gib, 0, True):
        problem = f"--memory-cap-gib must be a number >= 0, got {args.memory_cap_gib}"
    elif out_of_range(args.timeout, 0, False):
        problem = f"--timeout must be a number of seconds > 0, got {args.timeout}"
    elif args.json_path and not Path(args.json_path).resolve().parent.is_dir():
        problem = f"--json {args.json_path}: its folder does not exist"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    common = ["--engine", str(Path(args.engine).resolve()), "--device", args.device]
    common += ["--model-config", args.model_config, "--weight-dir", args.weight_dir]
    results = [run_capped(s, common, args.memory_cap_gib, args.timeout) for s in scripts]
    for r in results:
        print(f"{r['script']}: {'passed' if r['rc'] == 0 else 'FAILED: ' + r.get('error', '')}")
        for case in r.get("result") or [] if isinstance(r.get("result"), list) else []:
            print(
                f"  {case['case_name']}: {case['elapsed_ms']:.3f} ms, "
                f"{case['tokens_per_second']:,.0f} tok/s, peak {case['peak_memory_mb']:,.0f} MiB"
            )
    report = {"memory_cap_gib": args.memory_cap_gib, "engine": args.engine, "scripts": results}
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
