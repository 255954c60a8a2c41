"""The written engine's assembly rendered again with no kernel tables: the hand rules' twin of a
run.sh engine, for an A/B of the kernel search against the rules (#70's H100 question;
`gpu_check.sh handab` times the two alternately).

    python experiments/hand_twin.py workspace/engine.py /tmp/hand.py

The twin takes the written file's assembly (its study's trial of that name), memory budget and
weights format from the file's header; it prints how many lines differ (the tables and the
header alone, where the study's tree renders the file).
"""

import argparse
import difflib
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import optuna  # noqa: E402

from variants.render import render_engine  # noqa: E402
from variants.variant import Variant  # noqa: E402


def header_field(text: str, pattern: str) -> str:
    found = re.search(pattern, text, re.M)
    if found is None:
        raise SystemExit(f"hand_twin: the engine file has no line matching {pattern!r}")
    return found.group(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", help="an engine.py run.sh wrote")
    parser.add_argument("out", help="where the twin goes")
    args = parser.parse_args()
    text = Path(args.engine).read_text()
    name = header_field(text, r"^# variant: (\S+)")
    study_name, storage = re.search(r"^# study: (\S+) \((\S+)\)", text, re.M).groups()
    budget = header_field(text, r"^MEMORY_BUDGET_GIB = (\S+)")
    weights = header_field(text, r"^# weights: .*?, read as (\S+) \(")
    study = optuna.load_study(study_name=study_name, storage=storage)
    trial = next(t for t in study.trials if t.user_attrs.get("variant_name") == name)
    variant = Variant.from_dict(trial.user_attrs["variant"])
    gib = None if budget == "None" else float(budget)
    render_engine(variant, args.out, f"the hand rules' twin of {args.engine}", gib, weights=weights)
    diff = difflib.unified_diff(text.splitlines(), Path(args.out).read_text().splitlines(), n=0)
    changed = [ln for ln in diff if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
    print(f"twin of trial {trial.number} ({name}), budget {gib} GiB: {len(changed)} lines differ")
    for line in changed[:60]:
        print("  ", line[:160])
    return 0


if __name__ == "__main__":
    sys.exit(main())
