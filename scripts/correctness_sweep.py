"""Correctness of the offered space, one axis at a time: every choice the capability probe offers
on this machine, each applied to a base assembly, rendered and checked (public and stress).

The full cross product is thousands of engines; varying one axis at a time puts every component
through the gate at least once, which is what "every offered choice is correct" needs."""

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evaluator.correctness import check_engine  # noqa: E402
from evaluator.engine_loader import load_engine_module  # noqa: E402
from variants.probe import probe_capabilities  # noqa: E402
from variants.registry import AXES  # noqa: E402
from variants.render import render_engine  # noqa: E402
from variants.variant import Variant  # noqa: E402


def one_axis_variants(caps, base: Variant, skip_compile: bool) -> list:
    found = {base}
    for axis in AXES:
        for value in axis.values:
            v = dataclasses.replace(base, **{axis.name: value})
            if axis.name == "block_size":
                v = dataclasses.replace(v, cache="paged")
            if axis.name == "sdpa_backend":
                v = dataclasses.replace(v, attention="sdpa")
            if axis.name == "prefill_graphs":  # needs the fixed-grid Triton attention
                v = dataclasses.replace(v, attention="triton")
            if axis.name == "compile_mode":
                v = dataclasses.replace(v, execution="compile")
            if skip_compile and v.execution == "compile" and axis.name != "compile_mode":
                continue
            if caps.why_invalid(v) is None:
                found.add(v)
    return sorted(found, key=lambda v: v.name)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-config", default="target/model_config.json")
    p.add_argument("--weight-dir", default="target/weights")
    p.add_argument("--device", default="cuda")
    p.add_argument("--base", default="{}", help="JSON fields of the base variant")
    p.add_argument("--skip-compile", action="store_true")
    p.add_argument("--only-base", action="store_true", help="check the base variant alone")
    p.add_argument("--out", default="workspace/correctness_sweep.jsonl")
    p.add_argument("--shard", default="0/1", help="K/N: check every N-th variant from the K-th")
    args = p.parse_args()
    shard, shards = (int(x) for x in args.shard.split("/"))
    config = json.loads(Path(args.model_config).read_text())
    caps = probe_capabilities(args.device, config)
    base = Variant(**json.loads(args.base))
    variants = [base] if args.only_base else one_axis_variants(caps, base, args.skip_compile)
    variants = variants[shard::shards]
    print(f"{len(variants)} variants (shard {shard}/{shards})")
    failures = 0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for v in variants:
        t0 = time.perf_counter()
        path = render_engine(v, out.parent / f"sweep_engine_{shard}.py")
        try:
            cases = check_engine(
                load_engine_module(path).create_engine, config, args.weight_dir, args.device
            )
            ok = all(c["passed"] for c in cases.values())
            share = max(c["tol_share"] for c in cases.values())
            reason = "; ".join(str(c["failure"]) for c in cases.values() if not c["passed"])
        except Exception as exc:  # a crash is a failure of this variant, not of the sweep
            ok, share, reason = False, None, f"{type(exc).__name__}: {exc}"
        failures += not ok
        row = {
            "variant": v.name,
            "passed": ok,
            "tol_share": share,
            "reason": reason,
            "seconds": round(time.perf_counter() - t0, 1),
        }
        print(json.dumps(row), flush=True)
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
    print(f"{len(variants) - failures}/{len(variants)} passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
