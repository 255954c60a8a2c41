"""A prefill's projections on cuBLAS against our tiled kernel (`wide_linear`) at each of its
launches (WIDE_TILES x WIDE_SPLITS), at each row count: CUDA graphs of back-to-back GEMMs over
enough weight copies that L2 holds none of them (`bench_few_row.copies_for`); us a GEMM, median
of 20 replays. Whether a prefill's 128-512 rows leave cuBLAS room, and at which launch.

    python experiments/bench_wide_linear.py --model-config C --rows 128,256,512 [--top 3]"""

import argparse
import functools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from experiments.bench_few_row import copies_for, graph_us  # noqa: E402
from experiments.bench_projections import chain, projection_shapes  # noqa: E402
from tuning.decode_attention import build_all  # noqa: E402
from variants.kernels.wide_linear import (  # noqa: E402
    SHARED_MEMORY_LIMIT,
    WIDE_SPLITS,
    WIDE_TILES,
    shared_bytes,
    wide_linear,
)


def launches(x: torch.Tensor, weights: list) -> list:
    """(us, tiles, split) of every launch that fits, fastest first."""
    fit = [(t, s) for t in WIDE_TILES if shared_bytes(t) <= SHARED_MEMORY_LIMIT
           for s in WIDE_SPLITS]  # fmt: skip
    build_all(lambda launch: wide_linear(x, weights[0], *launch), fit)  # compiles side by side
    timed = []
    for tiles, split in fit:
        ours = functools.partial(wide_linear, tiles=tiles, split_k=split)
        try:
            timed.append((graph_us(chain(ours, x, weights)), tiles, split))
        except Exception as e:  # (a launch this GPU cannot run: out of shared memory)
            print(f"  {tiles} x{split}: {type(e).__name__}", flush=True)
    return sorted(timed, key=lambda t: t[0])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-config", default="target/model_config.json")
    p.add_argument("--rows", default="128,256,512")
    p.add_argument("--dtype", default="bfloat16", choices=("float16", "bfloat16"))
    p.add_argument("--only", default=None, help="comma-separated projection names")
    p.add_argument("--top", type=int, default=3, help="our fastest launches to print")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    config = json.loads(Path(args.model_config).read_text())
    device, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    with torch.no_grad():
        for name, (n, k) in projection_shapes(config).items():
            if name == "head" or (args.only and name not in args.only.split(",")):
                continue
            weights = [torch.randn(n, k, device=device, dtype=dtype) * 0.02
                       for _ in range(copies_for(n * k * 2))]  # fmt: skip
            for m in (int(r) for r in args.rows.split(",")):
                x = torch.randn(m, k, device=device, dtype=dtype)
                cublas = graph_us(chain(F.linear, x, weights))
                timed = launches(x, weights)
                us, tiles, split = timed[0]
                err = (wide_linear(x, weights[0], tiles, split).float()
                       - F.linear(x, weights[0]).float()).abs().max().item()  # fmt: skip
                print(f"{name:8s} {m:5d} rows: cuBLAS {cublas:7.2f} us "
                      f"({n * k * 2 / cublas / 1e3:5.0f} GB/s)  ours' best {us:7.2f} "
                      f"({cublas / us:4.2f}x) at {tiles} x{split}  (max |ours - cuBLAS| "
                      f"{err:.4f})", flush=True)  # fmt: skip
                for us, tiles, split in timed[1 : args.top]:
                    print(f"{'':21s} then {us:7.2f} at {tiles} x{split}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
