"""GPU micro-benchmark of the persistent decode layer (variants/kernels/decode_layer.py) against
the fused layers' five kernels, at the public model's sizes, inside CUDA graphs: a graph holds
one call per layer over 12 layers of their own weights (as a decode step; L2 holds none of
them), and the time per layer is the median replay over 12. Also each phase alone (one launch a
phase, no barrier), and a kernel of nothing but four grid barriers, to split the layer's time
into work and waiting.

    python scripts/bench_decode_layer.py [--rows 8] [--ctx 150] [--grid N,...] [--splits N,...]
        [--warps N,...] [--json PATH]

--grid beyond one program an SM hangs unless that many fit on the GPU side by side (the
persistent layer's programs wait for each other): check the registers and shared memory it
prints first.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.bench_few_row import graph_us  # noqa: E402
from variants.kernels import decode_layer  # noqa: E402
from variants.kernels.decode_attention import paged_decode_attention  # noqa: E402
from variants.kernels.decode_attention_rules import choose_num_splits, graph_context_buckets  # noqa: E402
from variants.kernels.device import device_sm_count  # noqa: E402
from variants.kernels.few_row_linear import few_row_linear  # noqa: E402
from variants.kernels.grid_barrier import grid_barrier, leave  # noqa: E402
from variants.kernels.norm_qkv_rope import norm_qkv_rope  # noqa: E402
from variants.kernels.norm_swiglu import norm_swiglu  # noqa: E402
from variants.spec import ModelSpec  # noqa: E402

log = logging.getLogger("bench_decode_layer")
LAYERS, BLOCK = 12, 64


@triton.jit
def _barriers_kernel(counters_ptr, BARRIERS: tl.constexpr):
    for n in tl.static_range(1, BARRIERS + 1):
        grid_barrier(counters_ptr, n)
    leave(counters_ptr)


@triton.jit
def _load_spin_barrier(counters_ptr, n):
    """grid_barrier with the wait on plain volatile loads instead of atomics, one acquire after."""
    target = n * tl.num_programs(0)
    tl.debug_barrier()
    seen = tl.atomic_add(counters_ptr, 1, sem="acq_rel", scope="gpu") + 1
    while seen < target:
        seen = tl.load(counters_ptr, volatile=True)
    tl.atomic_add(counters_ptr + 2, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _load_spin_kernel(counters_ptr, BARRIERS: tl.constexpr):
    for n in tl.static_range(1, BARRIERS + 1):
        _load_spin_barrier(counters_ptr, n)
    leave(counters_ptr)


def public_spec() -> ModelSpec:
    config = json.loads(Path("target/model_config.json").read_text())
    return ModelSpec.from_config(config)


def inputs(spec, rows: int, ctx: int):
    h, i, d, dt = spec.hidden_size, spec.intermediate_size, spec.head_dim, torch.float16
    q_dim, kv_dim = spec.num_heads * d, spec.num_kv_heads * d

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda") * scale).to(dt)

    layers = [
        SimpleNamespace(
            input_norm=1 + rand(h, scale=0.1),
            qkv=[rand(q_dim + 2 * kv_dim, h, scale=h**-0.5)],
            o=rand(h, q_dim, scale=q_dim**-0.5),
            post_norm=1 + rand(h, scale=0.1),
            gate_up=[rand(2 * i, h, scale=h**-0.5)],
            down=rand(h, i, scale=i**-0.5),
        )  # fmt: skip
        for _ in range(LAYERS)
    ]
    width = -(-ctx // BLOCK)
    table = torch.arange(rows * width, device="cuda", dtype=torch.int32).view(rows, width)
    slots = rows * width * BLOCK
    pools = [(rand(slots, spec.num_kv_heads, d), rand(slots, spec.num_kv_heads, d))
             for _ in range(LAYERS)]  # fmt: skip
    pos = ctx - 1
    write = (table[:, pos // BLOCK].long() * BLOCK + pos % BLOCK).contiguous()
    angles = pos / 10000 ** (torch.arange(0, d, 2, device="cuda").float() / d)
    cos = angles.cos().to(dt).expand(rows, -1).contiguous()
    sin = angles.sin().to(dt).expand(rows, -1).contiguous()
    lens = torch.full((rows,), ctx, device="cuda", dtype=torch.int32)
    return SimpleNamespace(layers=layers, pools=pools, table=table, write=write, cos=cos,
                           sin=sin, lens=lens, x=rand(rows, h))  # fmt: skip


def fused_calls(spec, t, sms: int) -> list:
    d, eps, rows = spec.head_dim, spec.rms_norm_eps, t.x.shape[0]
    ctx = int(t.lens[0])  # the splits of the decode graph that serves this context
    capability = torch.cuda.get_device_capability()
    bucket = next(c for c in graph_context_buckets(spec.max_positions, capability) if c >= ctx)
    splits = choose_num_splits(bucket, rows, spec.num_kv_heads, sms, capability)

    def layer(w, k_pool, v_pool):
        def call():
            q = norm_qkv_rope(t.x, w.input_norm, w.qkv[0], eps, d, spec.num_heads * d, t.cos,
                              t.sin, k_pool, v_pool, t.write, sm_count=sms)  # fmt: skip
            o = paged_decode_attention(q.view(rows, -1, d), k_pool, v_pool, t.table, t.lens,
                                       BLOCK, 1 / math.sqrt(d), splits).flatten(1)  # fmt: skip
            x = few_row_linear(o, w.o, residual=t.x, sm_count=sms)
            act = norm_swiglu(x, w.post_norm, w.gate_up[0], eps, sm_count=sms)
            few_row_linear(act, w.down, residual=x, sm_count=sms)

        return call

    return [layer(w, *p) for w, p in zip(t.layers, t.pools)]


def persistent_calls(spec, t, sms: int, phases=None, prefetch=True, **overrides) -> tuple:
    rows = t.x.shape[0]
    runner = decode_layer.DecodeLayers(spec, rows, spec.max_positions, torch.device("cuda"),
                                       torch.float16, sms, prefetch=prefetch,
                                       **overrides)  # fmt: skip
    if phases is not None:
        runner.phased = True
        runner_launch = runner._launch
        runner._launch = lambda args, first, last: (
            runner_launch(args, first, last) if first in phases else None
        )

    def layer(n, w, k_pool, v_pool):
        after = t.layers[(n + 1) % LAYERS].qkv[0]
        return lambda: runner.run(t.x, w, t.cos, t.sin, t.write, k_pool, v_pool, t.table,
                                  t.lens, BLOCK, next_weight=after)  # fmt: skip

    return [layer(n, w, *p) for n, (w, p) in enumerate(zip(t.layers, t.pools))], runner


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--ctx", type=int, default=150)
    p.add_argument("--grid", default="", help="programs to try beside the default, e.g. 96,264")
    p.add_argument("--splits", default="", help="attention splits to try beside the default")
    p.add_argument("--warps", default="", help="warps to try beside 4")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    spec, sms = public_spec(), device_sm_count(torch.device("cuda"))
    t = inputs(spec, args.rows, args.ctx)
    rows = []

    def record(name: str, us: float, **extra) -> None:
        rows.append(dict(name=name, us_per_layer=round(us, 2), **extra))
        log.info("%-34s %8.2f us %s", name, us, extra or "")

    record("fused (5 kernels)", graph_us(fused_calls(spec, t, sms)))
    calls, runner = persistent_calls(spec, t, sms)
    us = graph_us(calls)
    k = runner.compiled
    record("persistent", us, grid=runner.grid[0], splits=runner.meta["NUM_SPLITS"],
           regs=k.n_regs, spills=k.n_spills, shared=k.metadata.shared)  # fmt: skip
    record("persistent, no prefetch", graph_us(persistent_calls(spec, t, sms, prefetch=False)[0]))
    for phase in range(1, decode_layer.PHASES + 1):
        calls, _ = persistent_calls(spec, t, sms, phases={phase})
        record(f"phase {phase} alone", graph_us(calls))
    for grid in [int(g) for g in args.grid.split(",") if g]:
        calls, runner = persistent_calls(spec, t, sms, grid=grid)
        record(f"persistent grid {grid}", graph_us(calls))
    for splits in [int(s) for s in args.splits.split(",") if s]:
        calls, runner = persistent_calls(spec, t, sms, attention_splits=splits)
        record(f"persistent splits {splits}", graph_us(calls))
    for warps in [int(w) for w in args.warps.split(",") if w]:
        calls, runner = persistent_calls(spec, t, sms, warps=warps)
        record(f"persistent warps {warps}", graph_us(calls))
    counters = torch.zeros(4, device="cuda", dtype=torch.int32)
    for kernel in (_barriers_kernel, _load_spin_kernel):
        for grid in (sms, 2 * sms):
            call = lambda g=grid, k=kernel: k[(g,)](counters, BARRIERS=4)  # noqa: E731
            record(f"4 barriers {kernel.__name__[1:8]}, grid {grid}", graph_us([call] * LAYERS))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(rows=args.rows, ctx=args.ctx, results=rows)))


if __name__ == "__main__":
    main()
