"""One decode step's kernels in time order, as its CUDA graph runs them: the preset's engine
at each shape (rows x context), its step graph replayed under the profiler, and one replay's
kernels with their start and end (us from the replay's first kernel). Per kind of kernel: how
many, the sum of start-to-end, and the sum of the time to the next kernel's start. With PDL a
kernel starts while the one before runs, so start-to-end sums overlap; the second sum adds
up to the replay.

    python experiments/step_timeline.py --shapes 4x2048,4x150 [--preset NAME] [--first 14]
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.decode_step_profile import graph_replay_us  # noqa: E402
from variants import build_engine  # noqa: E402
from variants.presets import PRESETS  # noqa: E402

# Kernel kinds by a part of the kernel's name, first match wins; cuBLAS's GEMMs are "gemm".
KINDS = (
    ("_decode_split", "decode attention"),
    ("_norm_qkv_rope", "norm + QKV + RoPE"),
    ("_few_row_linear", "few-row projection"),
    ("_norm_swiglu", "norm + gate-up + SiLU-mul"),
    ("_silu_mul", "SiLU-mul"),
    ("_rope_cache_write", "RoPE + cache write"),
    ("_add_rms_norm", "add + RMSNorm"),
    ("nvjet", "gemm"),
    ("gemm", "gemm"),
    ("cutlass", "gemm"),
)


def kernel_kind(name: str) -> str:
    """The kind of a profiled kernel (KINDS), or its name's first 40 characters."""
    return next((kind for part, kind in KINDS if part in name), name[:40])


def summarize(rows: list) -> dict:
    """rows: (kind, start, end) in start order. {kind: {"count", "span_us", "to_next_us"}}:
    span is start to end; to_next is from its start to the next kernel's start (the last
    kernel: to its end), so the to_next sums add up to the whole replay."""
    out: dict = {}
    for i, (kind, start, end) in enumerate(rows):
        after = rows[i + 1][1] if i + 1 < len(rows) else end
        cell = out.setdefault(kind, {"count": 0, "span_us": 0.0, "to_next_us": 0.0})
        cell["count"] += 1
        cell["span_us"] += end - start
        cell["to_next_us"] += max(0.0, after - start)
    return {k: {n: round(v, 1) if isinstance(v, float) else v for n, v in c.items()}
            for k, c in out.items()}  # fmt: skip


def one_replay(events: list, replays: int, which: int) -> list:
    """(kind, start, end) of replay `which` (0-based) of `replays` back-to-back replays whose
    GPU events are `events`, in start order, from that replay's first start."""
    events = sorted(events, key=lambda e: e.time_range.start)
    per = len(events) // replays
    chosen = events[which * per : (which + 1) * per]
    t0 = chosen[0].time_range.start
    return [(kernel_kind(e.name), e.time_range.start - t0, e.time_range.end - t0)
            for e in chosen]  # fmt: skip


def timeline(engine, config, batch: int, ctx: int, replays: int = 5) -> dict:
    gen = torch.Generator().manual_seed(batch * 1000 + ctx)
    ids = list(range(batch))
    vocab = config["vocab_size"]
    engine.prefill(ids, [torch.randint(0, vocab, (ctx,), generator=gen).cuda() for _ in ids])
    for _ in range(3):
        engine.decode(ids, torch.randint(0, vocab, (batch,), generator=gen).cuda())
    longest = max(engine.lengths.values())
    timing = graph_replay_us(engine, batch, longest, replays=200)
    graphs = engine.decode_runner
    bucket = next(s for s in graphs.batches if s >= batch)
    graph = graphs.graphs[bucket, next(c for c in graphs.contexts if c >= longest)]
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    gpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    rows = one_replay(gpu, replays, replays // 2)
    engine.remove(ids)
    return {"shape": f"{batch}x{ctx}", "graph": timing, "kernels": len(rows),
            "replay_us": round(rows[-1][2], 1), "kinds": summarize(rows), "rows": rows}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-config", default="target/model_config.json")
    p.add_argument("--weight-dir", default="target/weights")
    p.add_argument("--preset", default="slab-triton-pdl-allgraphs", choices=sorted(PRESETS))
    p.add_argument("--shapes", default="4x2048,4x150")
    p.add_argument("--first", type=int, default=14, help="kernels of the replay to print")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA device", file=sys.stderr)
        return 2
    config = json.loads(Path(args.model_config).read_text())
    engine = build_engine(config, args.weight_dir, "cuda", PRESETS[args.preset])
    results = []
    for shape in args.shapes.split(","):
        batch, ctx = (int(v) for v in shape.split("x"))
        r = timeline(engine, config, batch, ctx)
        results.append(r)
        print(f"== {r['shape']}: graph {r['graph']}, {r['kernels']} kernels, "
              f"one replay {r['replay_us']} us")  # fmt: skip
        for kind, cell in sorted(r["kinds"].items(), key=lambda kv: -kv[1]["to_next_us"]):
            print(f"  {kind:28s} x{cell['count']:3d}  start to end {cell['span_us']:8.1f}  "
                  f"to the next start {cell['to_next_us']:8.1f}")  # fmt: skip
        for kind, start, end in r["rows"][: args.first]:
            print(f"    {kind:28s} {start:8.1f} {end:8.1f} ({end - start:5.1f})")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
