"""Whether a plain Triton GEMM on Hopper's TMA matches cuBLAS at a prefill's 128-512 rows, and
what a norm prologue (A scaled by rstd[m] and the norm weight g[k] in registers before the
dot) costs it. The question behind folding the prefill's small kernels (add + RMSNorm, SiLU-mul)
into its projections: that only pays if the GEMM first keeps up with cuBLAS.

CUDA graphs of back-to-back GEMMs over enough weight copies that L2 holds none of them
(`bench_few_row.copies_for`), us a GEMM, median of 20 replays; the best of 16 tile settings
(and with `--warp-specialize` 16 more, Triton's warp-specialized loop) for each shape.

    python experiments/bench_tma_gemm.py --rows 128,256,512 [--warp-specialize] [--json PATH]

Needs CUDA and a Triton with host tensor descriptors (3.4 and newer); the kernel itself also
runs under Triton's interpreter (tests/scripts/test_bench_tma_gemm.py)."""

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.bench_few_row import copies_for, graph_us  # noqa: E402

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # an older Triton: nothing here runs
    TensorDescriptor = None


@triton.jit
def _tma_matmul(
    a_desc, w_desc, c_desc, rstd_ptr, g_ptr, M, N, K,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr,
    PROLOGUE: tl.constexpr, WS: tl.constexpr,
):  # fmt: skip
    """c = a @ w.T, a program per (BM, BN) tile; PROLOGUE: a is first scaled as a norm would
    (by rstd per row, rounded, then by g per column, rounded)."""
    pid = tl.program_id(0)
    pm, pn = pid // tl.cdiv(N, BN), pid % tl.cdiv(N, BN)
    rows = pm * BM + tl.arange(0, BM)
    if PROLOGUE:
        rstd = tl.load(rstd_ptr + rows, mask=rows < M, other=0.0)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in tl.range(0, K, BK, num_stages=STAGES, warp_specialize=WS):
        a = a_desc.load([pm * BM, k])
        w = w_desc.load([pn * BN, k])
        if PROLOGUE:
            g = tl.load(g_ptr + k + tl.arange(0, BK))
            a = ((a.to(tl.float32) * rstd[:, None]).to(tl.float16) * g[None, :]).to(tl.float16)
        acc = tl.dot(a, w.T, acc)
    c_desc.store([pm * BM, pn * BN], acc.to(tl.float16))


def tma_linear(x, w, out, tiles: tuple, prologue=None, warp_specialize: bool = False):
    """out = x @ w.T (float16, contiguous, K a multiple of the tile's BK); `prologue`:
    (rstd float32 [M], g float16 [K]), x normalised on the way in. tiles: (BM, BN, BK, stages,
    warps)."""
    bm, bn, bk, stages, warps = tiles
    (m, k), n = x.shape, w.shape[0]
    assert k % bk == 0, "K a multiple of BK: the prologue reads g unmasked"
    rstd, g = prologue if prologue is not None else (x, x)  # unread without the prologue
    _tma_matmul[(triton.cdiv(m, bm) * triton.cdiv(n, bn),)](
        TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
        TensorDescriptor.from_tensor(out, [bm, bn]), rstd, g, m, n, k, BM=bm, BN=bn, BK=bk,
        STAGES=stages, PROLOGUE=prologue is not None, WS=warp_specialize, num_warps=warps,
    )  # fmt: skip
    return out


def normed(x, rstd, g):
    """What the prologue feeds the dot, in torch: the reference for its results."""
    return ((x.float() * rstd[:, None]).half() * g).half()


TILES = [(bm, bn, 64, stages, warps) for bm in (64, 128) for bn in (64, 128)
         for stages in (3, 4) for warps in (4, 8)]  # fmt: skip
SHAPES = {"qkv": (2304, 768), "output": (768, 768), "gate-up": (6144, 768), "down": (768, 3072)}
PROLOGUE_SHAPES = ("qkv", "gate-up")  # the projections a norm precedes


def best_of(x, ws, outs, settings, prologue=None) -> dict:
    """The fastest setting's us a GEMM, with its max difference from F.linear on its input;
    settings that do not build are counted."""
    a = x if prologue is None else normed(x, *prologue)
    want = F.linear(a, ws[0]).float()
    best, failed = None, 0
    for tiles, spec in settings:
        try:
            got = tma_linear(x, ws[0], outs[0], tiles, prologue, spec).float()
            call = functools.partial(tma_linear, tiles=tiles, prologue=prologue,
                                     warp_specialize=spec)  # fmt: skip
            us = graph_us([functools.partial(call, x, w, o) for w, o in zip(ws, outs)])
        except Exception:  # a setting this Triton cannot build (e.g. its specialized loop)
            failed += 1
            continue
        if best is None or us < best["us"]:
            err = (got - want).abs().max().item()
            best = {"us": round(us, 2), "tiles": tiles, "warp_specialize": spec, "err": err}
    return {"best": best, "failed": failed}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", default="128,256,512")
    p.add_argument("--warp-specialize", action="store_true", help="also the specialized loop")
    p.add_argument("--budget-s", type=float, default=300.0, help="stop starting shapes after")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if not torch.cuda.is_available() or TensorDescriptor is None:
        print("needs CUDA and Triton tensor descriptors", file=sys.stderr)
        return 2
    dev, start, rows = torch.device("cuda"), time.monotonic(), []
    specs = (False, True) if args.warp_specialize else (False,)
    with torch.no_grad():
        for name, (n, k) in SHAPES.items():
            ws = [torch.randn(n, k, device=dev, dtype=torch.float16) * 0.02
                  for _ in range(copies_for(n * k * 2))]  # fmt: skip
            g = torch.rand(k, device=dev, dtype=torch.float16) + 0.5
            for m in (int(r) for r in args.rows.split(",")):
                if time.monotonic() - start > args.budget_s:
                    print("budget spent", flush=True)
                    break
                x = torch.randn(m, k, device=dev, dtype=torch.float16)
                rstd = torch.rand(m, device=dev) + 0.5
                outs = [torch.empty(m, n, device=dev, dtype=torch.float16) for _ in ws]
                settings = [(t, s) for t in TILES for s in specs if m % t[0] == 0]
                mm = [functools.partial(torch.matmul, x, w.T, out=o) for w, o in zip(ws, outs)]
                row = {"shape": name, "rows": m, "cublas_us": round(graph_us(mm), 2),
                       "tma": best_of(x, ws, outs, settings)}  # fmt: skip
                if name in PROLOGUE_SHAPES:
                    row["tma_prologue"] = best_of(x, ws, outs, settings, (rstd, g))
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"results": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
