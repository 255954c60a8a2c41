"""Hand-picked assemblies x traces, measured with the grader's full protocol (GPU table).

Each variant goes through the same trial process as the search (render, correctness gate,
warm-up + fresh engine per repeat + median), so the table and the study measure alike. Writes
one JSON line per variant as it finishes and a markdown table at the end."""

import argparse
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evaluator.floor import measure_ceilings  # noqa: E402
from search.trial import TrialRunner  # noqa: E402
from variants.presets import PRESETS  # noqa: E402
from variants.variant import Variant  # noqa: E402

TABLE = {
    "safest": dict(cache="slab", attention="manual", fuse_qkv=False, fuse_gate_up=False),
    "contiguous-sdpa": dict(cache="contiguous", attention="sdpa"),
    "slab-sdpa": dict(cache="slab", attention="sdpa"),
    "paged64-sdpa": dict(cache="paged", block_size=64, attention="sdpa"),
    "slab-sdpa-compile": dict(cache="slab", attention="sdpa", execution="compile"),
    "slab-sdpa-graphs": dict(cache="slab", attention="sdpa", graphs="pow2"),
    "paged64-sdpa-graphs": dict(cache="paged", block_size=64, attention="sdpa", graphs="pow2"),
    "slab-sdpa-compile-graphs": dict(
        cache="slab", attention="sdpa", execution="compile", graphs="pow2"
    ),
    "slab-triton": dict(cache="slab", attention="triton"),
    "slab-triton-graphs": dict(cache="slab", attention="triton", graphs="pow2"),
    "paged64-triton-graphs": dict(cache="paged", block_size=64, attention="triton", graphs="pow2"),
    "slab-triton-fused-graphs": dict(
        cache="slab", attention="triton", layers="triton", graphs="pow2"
    ),
    "paged64-triton-fused-graphs": dict(
        cache="paged", block_size=64, attention="triton", layers="triton", graphs="pow2"
    ),
    "slab-triton-fused": dict(cache="slab", attention="triton", layers="triton"),
    "slab-sdpa-gemv-graphs": dict(cache="slab", attention="sdpa", layers="fused", graphs="pow2"),
}
TABLE.update({name: v.to_dict() for name, v in PRESETS.items()})  # the presets by name
TRACES = ("prefill", "decode", "mixed", "continuous", "wide_decode", "long_prompts")


def markdown(rows: list, traces: list) -> str:
    head = "| variant | " + " | ".join(f"{t} tok/s (floor eff)" for t in traces)
    head += " | peak MiB | create s | tol used |"
    lines = [head, "|" + " --- |" * (len(traces) + 4)]
    for r in rows:
        a = r["attrs"]
        if r["status"] != "ok":
            lines.append(f"| {r['name']} | {r['status']}: {str(r.get('reason'))[:80]} |")
            continue
        cells = []
        for t in traces:
            tps, eff = a.get(f"full_tps_{t}"), a.get(f"full_floor_eff_{t}")
            cells.append(
                "-" if tps is None else f"{tps:,.0f} ({eff:.3f})" if eff else f"{tps:,.0f}"
            )
        lines.append(
            f"| {r['name']} | "
            + " | ".join(cells)
            + f" | {a.get('full_peak_mib', 0):,.0f} | {a.get('full_create_s', 0):.2f}"
            + f" | {a.get('tol_share', 0):.3f} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-config", default="target/model_config.json")
    p.add_argument("--weight-dir", default="target/weights")
    p.add_argument("--device", default="cuda")
    p.add_argument("--variants", default=",".join(TABLE), help="names from the table")
    p.add_argument("--extra", action="append", default=[], help="name=JSON variant fields")
    p.add_argument("--traces", default=",".join(TRACES))
    p.add_argument("--out", default="workspace/variant_table")
    p.add_argument("--timeout", type=float, default=240)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    config = json.loads(Path(args.model_config).read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ceilings = measure_ceilings(args.device).to_dict()
    logging.info("ceilings %s", ceilings)
    traces = [t for t in args.traces.split(",") if t]
    runner = TrialRunner(
        config,
        args.weight_dir,
        args.device,
        traces=tuple(traces),
        timeout_s=args.timeout,
        ceilings=ceilings,
    )
    chosen = {n: TABLE[n] for n in args.variants.split(",") if n}
    for item in args.extra:
        name, _, fields = item.partition("=")
        chosen[name] = json.loads(fields)
    rows = []
    for name, fields in chosen.items():
        t0 = time.perf_counter()
        outcome = runner.run(Variant(**fields), protocol="full")
        row = {
            "name": name,
            "variant": fields,
            "status": outcome.status,
            "reason": outcome.reason,
            "attrs": outcome.attrs,
            "seconds": round(time.perf_counter() - t0, 1),
        }
        rows.append(row)
        with open(out / "variants.jsonl", "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        logging.info(
            "%s: %s in %.0f s (%s)",
            name,
            outcome.status,
            row["seconds"],
            outcome.attrs.get("full_tokens_per_s"),
        )
    table = markdown(rows, traces)
    (out / "table.md").write_text(f"ceilings: {ceilings}\n\n{table}\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
