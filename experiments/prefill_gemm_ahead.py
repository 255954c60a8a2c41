"""Two ways a prefill's cuBLAS projections might get faster without a GEMM of our own (ours lost
at every prefill shape: docs/PERF.md), at a model's shapes and 128-512 rows:

- **the library**: torch's GEMM through cuBLASLt (`torch.backends.cuda.preferred_blas_library`,
  torch 2.3 and newer) against plain cuBLAS, its default on CUDA;
- **the weight asked for a kernel ahead**: in a prefill each projection follows a short
  elementwise kernel (the norm before QKV and gate-up, RoPE before the attention and the output
  projection, SiLU-mul before down) that leaves HBM mostly idle. Here that kernel also asks for
  the first bytes of the next weight into L2 (`prefetch.global.L2`, kernels/prefetch.py), and
  the pair is timed against the same pair without the prefetch.

Each case is a CUDA graph over enough weight copies that L2 holds none of them
(`bench_few_row.copies_for`), each copy `elementwise(x) -> F.linear(h, W_i)`; us a pair, median
of 20 replays; the elementwise kernel reads and writes [rows, K] like the norm (the SiLU-mul
before down moves three times that; its window is wider, and so is its own traffic).

    python experiments/prefill_gemm_ahead.py --model-config C [--rows 128,256,512]
        [--dtype bfloat16] [--shares 0,0.25,0.5,1] [--weight-dir W [--preset P | --variant JSON]]

With `--weight-dir`: also the real thing, a fused-layers engine's prefill graph at each row
count (the token bucket), re-captured with each setting in its table's prefill entry
(`run_triton_stack`'s `ahead` and `library`) and replayed back to back; us a call, two rounds
(the settings in turn, then in reverse)."""

import functools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.bench_few_row import copies_for, graph_us  # noqa: E402
from experiments.bench_projections import (  # noqa: E402
    config_on_cuda,
    projection_parser,
    projection_shapes,
)
from variants.kernels.prefetch import prefetch_l2  # noqa: E402
from variants.presets import PRESETS  # noqa: E402
from variants.variant import Variant  # noqa: E402

L2_CAP = 40 << 20  # the most bytes asked for ahead (an H100's L2 is 50 MB)


@triton.jit
def _scale_rows_kernel(x_ptr, out_ptr, pf_ptr, pf_bytes, cols, BLOCK: tl.constexpr,
                       PREFETCH: tl.constexpr, LANES: tl.constexpr):  # fmt: skip
    """out = x * rsqrt(mean(x^2)) per row (a norm's traffic); first, with PREFETCH, this
    program's share of [pf_ptr, pf_ptr + pf_bytes) asked for into L2."""
    row = tl.program_id(0)
    if PREFETCH:
        prefetch_l2(pf_ptr, pf_bytes, row, tl.num_programs(0), LANES)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row.to(tl.int64) * cols + offs, mask=mask, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / cols + 1e-5)
    tl.store(out_ptr + row.to(tl.int64) * cols + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def scale_rows(x: torch.Tensor, ahead: torch.Tensor | None = None, nbytes: int = 0):
    rows, cols = x.shape
    out = torch.empty_like(x)
    block = triton.next_power_of_2(cols)
    warps = min(16, max(1, block // 256))
    _scale_rows_kernel[(rows,)](
        x, out, ahead if ahead is not None else x, nbytes, cols, BLOCK=block,
        PREFETCH=ahead is not None and nbytes > 0, LANES=32 * warps, num_warps=warps,
    )  # fmt: skip
    return out


def pair(x, weight, share: float):
    """The elementwise kernel (asking for `share` of the weight's bytes, at most L2_CAP), then
    the projection."""
    nbytes = min(int(share * weight.numel() * weight.element_size()), L2_CAP)
    return F.linear(scale_rows(x, weight if nbytes else None, nbytes), weight)


def chain_us(x, weights, share: float) -> float:
    return graph_us([functools.partial(pair, x, w, share) for w in weights])


def with_library(name: str, fn, *args):
    """fn(*args) with torch's GEMMs on `name` ("cublas" or "cublaslt"), the setting restored."""
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(name)
    try:
        return fn(*args)
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def gemms_us(x, weights) -> float:
    return graph_us([functools.partial(F.linear, x, w) for w in weights])


def engine_graphs(config: dict, weight_dir: str, variant, rows: list, shares: list) -> None:
    """The engine's prefill graph per token bucket, timed with each table setting."""
    from tuning.decode_attention import replay_ms
    from variants.build import build_engine
    from variants.execution.cuda_graphs import no_collection

    table = {("prefill", t): {} for t in rows}  # bound to the stack: the engine reads it live
    engine = build_engine(config, weight_dir, "cuda", variant, few_row_knobs=table)
    live, runner = engine.model.layers.keywords["knobs"], engine.prefill_runner
    settings = [("rules", {})] + [(f"ahead@{s:g}", {"ahead": s}) for s in shares if s]
    if hasattr(torch.backends.cuda, "preferred_blas_library"):
        settings += [(f"lt+{name}", {**entry, "library": "cublaslt"}) for name, entry in settings]
    for t in rows:
        timed: dict = {name: [] for name, _ in settings}
        for order in (settings, settings[::-1]):
            for name, entry in order:
                live[("prefill", t)] = entry
                stale = runner.graphs.pop(t)  # released after the new capture (StepBench)
                with no_collection():
                    runner._capture_bucket(t)
                del stale
                timed[name].append(replay_ms(runner.graphs[t]) * 1e3)
        cells = [
            f"{name} {' / '.join(f'{us:7.1f}' for us in runs)}" for name, runs in timed.items()
        ]
        print(f"prefill graph {t:5d} tokens (us, two rounds): " + "  ".join(cells), flush=True)


def main() -> int:
    p = projection_parser(__doc__, "128,256,512")
    p.add_argument("--dtype", default="bfloat16", choices=("float16", "bfloat16"))
    p.add_argument("--shares", default="0,0.25,0.5,1", help="shares of the weight asked ahead")
    p.add_argument("--weight-dir", default=None, help="also time an engine's prefill graphs")
    p.add_argument("--preset", default="slab-triton-gemv-allgraphs", help="a fused-layers preset")
    p.add_argument("--variant", default=None, help="a fused-layers Variant as JSON (or --preset)")
    args = p.parse_args()
    config = config_on_cuda(args.model_config)
    if config is None:
        return 2
    dtype, shares = getattr(torch, args.dtype), [float(s) for s in args.shares.split(",")]
    has_lt = hasattr(torch.backends.cuda, "preferred_blas_library")
    libraries = ["cublas", "cublaslt"] if has_lt else ["cublas"]
    with torch.no_grad():
        for name, (n, k) in projection_shapes(config).items():
            if name == "head" or (args.only and name not in args.only.split(",")):
                continue
            weights = [
                torch.randn(n, k, device="cuda", dtype=dtype) * 0.02
                for _ in range(copies_for(n * k * 2))
            ]
            for m in (int(r) for r in args.rows.split(",")):
                x = torch.randn(m, k, device="cuda", dtype=dtype)
                cells = [f"{lib} {with_library(lib, gemms_us, x, weights):6.2f}"
                         for lib in libraries]  # fmt: skip
                cells += [f"pair@{s:g} {with_library('cublas', chain_us, x, weights, s):6.2f}"
                          for s in shares]  # fmt: skip
                mib = n * k * 2 / 2**20
                print(f"{name:8s} {m:5d} rows ({mib:5.1f} MiB): " + "  ".join(cells), flush=True)
        if args.weight_dir:
            rows = [int(r) for r in args.rows.split(",")]
            variant = (Variant(**json.loads(args.variant)) if args.variant
                       else PRESETS[args.preset])  # fmt: skip
            engine_graphs(config, args.weight_dir, variant, rows, shares)
    return 0


if __name__ == "__main__":
    sys.exit(main())
