"""Where a decode step's time goes, kernel by kernel, against each kernel's own bytes (issue #72's
first table): one decode step of a written engine (or a preset) at BATCH x CTX profiled
(torch.profiler, the step's CUDA graph replayed), each kernel named by its place in the step
(qkv, attention, o, gateup, down per layer; the head), its time on the step's critical path and
the bytes it must move, against the GPU's measured device-to-device copy bandwidth.

    python experiments/step_bytes.py --model-config /tmp/gpu_models/llama16-bf16/config.json \\
        --weight-dir /tmp/gpu_models/llama16-bf16 --engine workspace/engine.py --shape 8x128

A kernel's critical time is its end less the later of its start and the previous kernel's end:
with programmatic dependent launch a kernel starts while the one before runs (it waits inside),
so its whole duration would count the wait twice. The rows' sum is the step's GPU time."""

import argparse
import importlib
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evaluator.engine_loader import load_engine_module  # noqa: E402
from evaluator.floor import measure_ceilings  # noqa: E402
from experiments.decode_step_profile import step_ms  # noqa: E402
from variants import build_engine  # noqa: E402
from variants.presets import PRESETS  # noqa: E402
from variants.spec import ModelSpec  # noqa: E402

# A kernel's place in the step, by the Triton function it runs (the fused-pdl and fused layers);
# the few-row linear kernel runs o then down in each layer, then the head.
BY_NAME = (
    ("norm_qkv_rope", "qkv"),
    ("decode_split", "attention"),
    ("norm_swiglu", "gateup"),
)
LINEAR = "few_row_linear"


def places(names: list[str], layers: int) -> list[str]:
    """Each kernel's place: qkv, attention, o, gateup, down, head, or `other: NAME`."""
    out, linear = [], 0
    for name in names:
        place = next((p for key, p in BY_NAME if key in name), None)
        if place is None and LINEAR in name:
            place = "head" if linear >= 2 * layers else ("o", "down")[linear % 2]
            linear += 1
        out.append(place or f"other: {name[:60]}")
    return out


def place_bytes(spec: ModelSpec, rows: int, ctx: int, size: int) -> dict[str, float]:
    """The bytes each place must move once a step (every layer's of a place summed): weights,
    the rows in and out, the KV cache read by the attention; `size` bytes an element."""
    h, d, inter = spec.hidden_size, spec.head_dim, spec.intermediate_size
    q, kv = spec.num_heads * d, spec.num_kv_heads * d
    layer = {
        "qkv": (h * (q + 2 * kv) + h) * size + rows * (h + q + 2 * kv) * size,
        "attention": rows * (2 * ctx * kv + 2 * q) * size,
        "o": q * h * size + rows * (q + 2 * h) * size,  # (the residual read and the sum written)
        "gateup": (2 * h * inter + h) * size + rows * (h + inter) * size,
        "down": inter * h * size + rows * (inter + 2 * h) * size,
    }
    out = {place: spec.num_layers * b for place, b in layer.items()}
    out["head"] = (spec.vocab_size * h + h) * size + rows * (h * size + spec.vocab_size * 4)
    return out


def critical_us(spans: list[tuple[float, float]]) -> list[float]:
    """Each span's (start, end) time on the step's critical path, in start order: its end less
    the later of its start and the previous end (0 where it ended first)."""
    out, last = [], None
    for start, end in spans:
        begin = start if last is None else max(start, last)
        out.append(max(0.0, end - begin))
        last = end if last is None else max(last, end)
    return out


def table(
    names: list[str], spans: list, spec: ModelSpec, rows: int, ctx: int, size: int, copy_gbs: float
) -> list[dict]:
    """One row a place: launches, microseconds (critical, and the kernels' own), bytes, the
    bandwidth the critical time gives, its share of the copy's and of the step."""
    where, crit = places(names, spec.num_layers), critical_us(spans)
    own = [end - start for start, end in spans]
    need, step = place_bytes(spec, rows, ctx, size), sum(crit)
    rows_out = []
    for place in dict.fromkeys(where):
        picked = [i for i, p in enumerate(where) if p == place]
        us = sum(crit[i] for i in picked)
        moved = need.get(place)
        gbs = moved / us / 1e3 if moved and us else None
        rows_out.append({
            "place": place, "launches": len(picked), "us": round(us, 1),
            "own_us": round(sum(own[i] for i in picked), 1),
            "mb": round(moved / 1e6, 2) if moved else None,
            "gbs": round(gbs) if gbs else None,
            "of_copy": round(gbs / copy_gbs, 3) if gbs else None,
            "of_step": round(us / step, 3) if step else None,
        })  # fmt: skip
    return rows_out


def engine_of(args, config):
    if args.engine:
        return load_engine_module(args.engine).create_engine(config, args.weight_dir, "cuda")
    tables = {}  # the kernel searches' tables (their --json), as a written engine carries them
    for name, module, path in (
        ("knobs", "tuning.decode_attention", args.knobs),
        ("few_row_knobs", "tuning.few_row", args.few_row_knobs),
    ):
        if path:
            table = json.loads(Path(path).read_text())["table"]
            tables[name] = importlib.import_module(module).table_from_json(table)
    return build_engine(config, args.weight_dir, "cuda", PRESETS[args.preset], **tables)


def profile_step(engine, config, batch: int, ctx: int) -> tuple[list, list, float]:
    """(kernel names, their (start, end) us, the step's median wall ms) of one decode step of
    `batch` rows at `ctx` tokens, its graph warm."""
    gen = torch.Generator().manual_seed(0)
    ids = list(range(batch))
    vocab = config["vocab_size"]
    engine.prefill(ids, [torch.randint(0, vocab, (ctx,), generator=gen).cuda() for _ in ids])
    tokens = [torch.randint(0, vocab, (batch,), generator=gen).cuda() for _ in range(30)]
    for t in tokens[:10]:
        engine.decode(ids, t)
    times = step_ms(engine, ids, tokens[10:])
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        engine.decode(ids, tokens[0])
        torch.cuda.synchronize()
    engine.remove(ids)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels.sort(key=lambda e: e.time_range.start)
    spans = [(float(e.time_range.start), float(e.time_range.end)) for e in kernels]
    return [e.name for e in kernels], spans, statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model-config", required=True)
    p.add_argument("--weight-dir", required=True)
    p.add_argument("--engine", default=None, help="a written engine.py (default: --preset's)")
    p.add_argument("--preset", default="slab-triton-pdl-allgraphs", choices=sorted(PRESETS))
    p.add_argument("--shape", action="append", default=[], help="BATCHxCTX; repeatable (8x128)")
    p.add_argument("--knobs", default=None, help="the decode attention search's --json")
    p.add_argument("--few-row-knobs", default=None, help="the few-row search's --json")
    p.add_argument("--bandwidth-gbs", type=float, default=None, help="default: measured")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("error: step_bytes.py needs a CUDA device", file=sys.stderr)
        return 2
    config = json.loads(Path(args.model_config).read_text())
    spec = ModelSpec.from_config(config)
    copy_gbs = measure_ceilings("cuda", bandwidth_gbs=args.bandwidth_gbs, tflops=1.0).bandwidth_gbs
    engine = engine_of(args, config)
    size = torch.tensor([], dtype=spec.config_dtype).element_size()
    out = []
    for shape in args.shape or ["8x128"]:
        batch, ctx = (int(v) for v in shape.split("x"))
        names, spans, wall_ms = profile_step(engine, config, batch, ctx)
        rows = table(names, spans, spec, batch, ctx, size, copy_gbs)
        total = sum(place_bytes(spec, batch, ctx, size).values())
        step_us = sum(r["us"] for r in rows)
        floor_us = total / copy_gbs / 1e3
        print(f"== {shape}: step {wall_ms * 1e3:.1f} us wall, {step_us:.1f} us of kernels")
        print(f"{total / 1e6:.1f} MB: {floor_us:.1f} us at the copy's {copy_gbs:.0f} GB/s, "
              f"{floor_us / (wall_ms * 1e3):.2f} of the wall step")  # fmt: skip
        print("| place | launches | us (critical) | us (own) | MB | GB/s | of the copy | of step |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print("| " + " | ".join("-" if v is None else str(v) for v in r.values()) + " |")
        out.append({"shape": shape, "wall_ms": wall_ms, "copy_gbs": copy_gbs, "rows": rows})
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
