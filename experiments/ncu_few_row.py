"""One of the fused few-row kernels alone at a model's sizes, launched a few times, for Nsight
Compute to profile one launch (as experiments/ncu_decode_attention.py does the attention):

    ncu --clock-control none --kernel-name regex:norm_qkv_rope --launch-skip 2 \\
        --launch-count 1 --section SpeedOfLight --section WarpStateStats \\
        python experiments/ncu_few_row.py --model-config C --case norm+qkv+rope+cache --rows 8

The cases are experiments/bench_few_row.py's (the launcher's own tiles and splits)."""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.bench_few_row import PUBLIC, cases, sizes_of  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-config", default=None, help="a model's sizes (default: the public)")
    p.add_argument("--case", default="norm+qkv+rope+cache")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--launches", type=int, default=3)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA device", file=sys.stderr)
        return 2
    sizes = (
        sizes_of(json.loads(Path(args.model_config).read_text())) if args.model_config else PUBLIC
    )
    dtype = getattr(torch, args.dtype)
    shape, ours, _ = cases(args.rows, dtype, sizes)[args.case]
    w = torch.randn(shape, device="cuda", dtype=dtype) / shape[1] ** 0.5
    for _ in range(args.launches):
        ours(w, None)
    torch.cuda.synchronize()
    print(f"{args.case} at {args.rows} rows: weight {tuple(shape)}, {w.nbytes / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
