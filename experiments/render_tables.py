"""A preset's (or a variant's) engine file with the kernel searches' tables written in, as run.sh
writes its engine: the tables from the searches' own commands (`--json`), so an engine of the
searched launches can be timed without a whole run.sh (issue #72's 1B decode traces):

    python -m tuning.decode_attention --config C --weight-dir W --preset P --json attn.json
    python -m tuning.few_row --config C --weight-dir W --preset P --json few.json
    python experiments/render_tables.py --preset P --knobs attn.json --few-row-knobs few.json \\
        --output /tmp/searched.py
    python evaluator/benchmark_throughput.py --engine /tmp/searched.py --suite public ...

Without tables it writes the hand rules' engine of the same assembly."""

import argparse
import importlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from variants.presets import PRESETS  # noqa: E402
from variants.render import render_engine  # noqa: E402
from variants.variant import Variant  # noqa: E402

TABLES = (
    ("knobs", "tuning.decode_attention"),
    ("few_row_knobs", "tuning.few_row"),
    ("prefill_knobs", "tuning.prefill_attention"),
)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="slab-triton-gemv-allgraphs", choices=sorted(PRESETS))
    p.add_argument("--variant", default=None, help="a Variant as JSON (instead of --preset)")
    p.add_argument("--output", required=True)
    for name, module in TABLES:
        p.add_argument(f"--{name.replace('_', '-')}", default=None, help=f"{module}'s --json")
    args = p.parse_args()
    variant = Variant(**json.loads(args.variant)) if args.variant else PRESETS[args.preset]
    tables = {}
    for name, module in TABLES:
        path = getattr(args, name)
        if path:
            table = json.loads(Path(path).read_text())["table"]
            tables[name] = importlib.import_module(module).table_from_json(table)
    render_engine(variant, args.output, "", **tables)
    print(f"wrote {args.output}: {variant.name}, tables: {', '.join(tables) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
