"""Does the written engine reuse the Triton kernels its trial compiled, and does another variant
reuse them? Renders `--preset` as a trial does (no header), then as run.sh writes it (with a
header), then each `--sibling`; runs evaluator/test_correctness.py on each in a fresh process, in
that order, over one Triton cache that starts empty, and prints each case's seconds and how many
compiled kernels the cache holds after it. Triton's cache key holds each kernel's line number:
the second engine should add no kernels, a sibling only its own builds.

    python experiments/compile_reuse.py --sibling paged64-triton-gemv-allgraphs [--json PATH]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from variants.presets import PRESETS  # noqa: E402
from variants.render import render_engine  # noqa: E402

HEADER = "Written by `bash run.sh` (python -m search run)\nvariant: {name}\nstudy s, trial 0"


def check(engine: Path, args, cache_dir: Path) -> dict:
    """test_correctness.py's cases for `engine` in a fresh process over `cache_dir`."""
    report = engine.with_suffix(".json")
    cmd = [sys.executable, str(REPO / "evaluator/test_correctness.py"), "--engine", str(engine)]
    cmd += ["--device", args.device, "--json", str(report)]
    cmd += ["--model-config", args.model_config, "--weight-dir", args.weight_dir]
    cmd += ["--cases", args.cases]
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache_dir))
    code = subprocess.run(cmd, env=env, capture_output=True, text=True).returncode
    cases = json.loads(report.read_text())["cases"] if report.is_file() else {}
    return {
        "exit": code,
        "cases": {c: {"seconds": r["seconds"], "passed": r["passed"]} for c, r in cases.items()},
        "kernels_cached": sum(1 for _ in cache_dir.rglob("*.cubin")),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", default="slab-triton-pdl-allgraphs", choices=sorted(PRESETS))
    p.add_argument("--sibling", action="append", default=[], choices=sorted(PRESETS))
    p.add_argument("--model-config", default=str(REPO / "target/model_config.json"))
    p.add_argument("--weight-dir", default=str(REPO / "target/weights"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--cases", default="public,stress")
    p.add_argument("--json", dest="json_path")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="compile_reuse_"))
    cache_dir = work / "triton_cache"
    cache_dir.mkdir()
    runs = [("trial", args.preset, ""), ("written", args.preset, HEADER)]
    runs += [(f"sibling {name}", name, "") for name in args.sibling]
    results = []
    for label, preset, header in runs:
        engine = render_engine(
            PRESETS[preset], work / f"{len(results)}" / "engine.py", header.format(name=preset)
        )
        result = {"engine": label, "preset": preset, **check(engine, args, cache_dir)}
        results.append(result)
        seconds = ", ".join(f"{c} {r['seconds']} s" for c, r in result["cases"].items())
        print(f"{label}: exit {result['exit']}; {seconds}; "
              f"{result['kernels_cached']} kernels in the cache", flush=True)  # fmt: skip
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all(r["exit"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
