"""Write course-format toy weights (`model.pt`) for a model config.

Example: python scripts/generate_toy_weights.py --config target/model_config.json \
    --output target/weights/model.pt
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from evaluator.toy_weights import save_toy_weights  # noqa: E402

log = logging.getLogger("generate_toy_weights")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="model config JSON")
    parser.add_argument("--output", default="target/weights/model.pt", help="model.pt to write")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--qk-scale", type=float, default=1.0, help="multiplies q/k_proj")
    parser.add_argument("--head-scale", type=float, default=1.0, help="multiplies lm_head")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    args = parse_args(argv)
    try:
        config = json.loads(Path(args.config).read_text())
        if not isinstance(config, dict):
            raise ValueError("model config must be a JSON object")
    except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
        print(f"error: cannot read config {args.config}: {exc}", file=sys.stderr)
        return 2
    try:
        path = save_toy_weights(
            config, args.output, seed=args.seed, qk_scale=args.qk_scale, head_scale=args.head_scale
        )
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    size_mib = path.stat().st_size / 2**20
    log.info(
        "wrote %s (%.1f MiB, seed %d, qk_scale %g, head_scale %g)",
        path,
        size_mib,
        args.seed,
        args.qk_scale,
        args.head_scale,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
