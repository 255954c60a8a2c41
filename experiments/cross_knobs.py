"""Two models' decode-attention tables crossed: each model's table is searched on this GPU (the
hand rules as the prior, cached under --cache-dir), then each model's engine (the fastest
preset) is checked (with the gate the search picks for that model, `--gate auto`) and timed on
every suite with its own table and with the other model's (`tuning.decode_attention.transplant`).
Each model's own table should win on that model. What --out holds already (a table, an engine
checked and timed) is reused, so a run can span calls.

    python experiments/cross_knobs.py --model course=target/model_config.json:target/weights \
        --model llama16=scripts/gpu_models/llama16-bf16.json:/tmp/gpu_models/llama16-bf16 \
        [--budget 120] [--cache-dir studies/kernels] [--out workspace/cross_knobs]
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuning.decode_attention import table_from_json, transplant  # noqa: E402
from variants.presets import PRESETS  # noqa: E402
from variants.render import render_engine  # noqa: E402

PRESET = "slab-triton-pdl-allgraphs"


def run(cmd: list, log: Path, timeout_s: float) -> int:
    with log.open("w") as out:
        try:
            return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s,
                                  cwd=ROOT).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            return 124


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", required=True, help="NAME=CONFIG:WEIGHT_DIR")
    p.add_argument("--budget", type=float, default=120.0, help="seconds of search a model")
    p.add_argument("--cache-dir", default="studies/kernels")
    p.add_argument("--out", default="workspace/cross_knobs")
    args = p.parse_args(argv)
    models = dict(m.split("=", 1) for m in args.model)
    models = {name: spec.split(":", 1) for name, spec in models.items()}
    if len(models) != 2:
        p.error("--model twice, two different names")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tables = {}
    for name, (config, weights) in models.items():
        path = out / f"{name}_table.json"
        if path.is_file():  # an earlier call's search (--out kept between calls)
            tables[name] = table_from_json(json.loads(path.read_text())["table"])
            print(f"{name}: {len(tables[name])} buckets, searched before: {path}")
            continue
        cmd = [sys.executable, "-m", "tuning.decode_attention", "--config", config,
               "--weight-dir", weights, "--preset", PRESET, "--budget", str(args.budget),
               "--cache-dir", args.cache_dir, "--json", str(path)]  # fmt: skip
        code = run(cmd, out / f"{name}_search.log", args.budget + 300)
        if code != 0 or not path.is_file():
            print(f"{name}: the search failed (exit {code}); see {out / f'{name}_search.log'}")
            return 1
        tables[name] = table_from_json(json.loads(path.read_text())["table"])
        print(f"{name}: {len(tables[name])} buckets, searched table {path}")
    timed = {}
    for name, (config, weights) in models.items():
        for source in models:
            done = out / f"{name}_with_{source}_done.json"  # checked and timed by an earlier call
            if done.is_file():
                timed[name, source] = tuple(json.loads(done.read_text()))
                continue
            table = tables[name] if source == name else transplant(tables[source], tables[name])
            engine = render_engine(PRESETS[PRESET], out / f"{name}_with_{source}.py", "", 8.0,
                                   knobs=table)  # fmt: skip
            target = ["--model-config", config, "--weight-dir", weights, "--device", "cuda"]
            check = [sys.executable, "evaluator/test_correctness.py", "--engine", str(engine),
                     "--gate", "auto"]  # fmt: skip
            checked = run([*check, *target], out / f"{name}_with_{source}_check.log", 600)
            report = out / f"{name}_with_{source}.json"
            run([sys.executable, "evaluator/benchmark_throughput.py", "--engine", str(engine),
                 *target, "--suite", "all", "--json", str(report)],
                out / f"{name}_with_{source}_bench.log", 600)  # fmt: skip
            traces = json.loads(report.read_text())["traces"] if report.is_file() else {}
            timed[name, source] = (checked == 0, traces)
            if traces:
                done.write_text(json.dumps(timed[name, source]))
    for name in models:
        other = next(s for s in models if s != name)
        (own_ok, own), (other_ok, theirs) = timed[name, name], timed[name, other]
        gate = {True: "passed", False: "FAILED"}
        print(
            f"\n{name}: its own table (gate {gate[own_ok]}) against {other}'s (gate "
            f"{gate[other_ok]}), ms (median of fresh engines)"
        )
        print(f"{'trace':16s} {'own':>10s} {other:>10s} {'theirs/own':>11s}")
        for trace in sorted(own):
            a, b = own[trace]["seconds"], theirs.get(trace, {}).get("seconds")
            cell = f"{1e3 * b:10.3f} {b / a:11.3f}" if b else f"{'-':>10s} {'-':>11s}"
            print(f"{trace:16s} {1e3 * a:10.3f} {cell}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
