"""How big a written engine is, and how much of it a correctness pass runs: lines of code (not
comments or docstrings) in the kernel modules and in the rest, per preset or variant, and with
`--coverage` (CPU, needs the `coverage` package) the share of statements that a prefill,
decodes, a removal and a re-prefill execute.

    python scripts/engine_size.py                       # every preset
    python scripts/engine_size.py --variant '{"cache": "slab", "attention": "sdpa"}' --coverage
    python scripts/engine_size.py --variant '{"cache": "slab", "attention": "sdpa"}' --modules

`--weights course` (the default) measures the engine run.sh writes for the course's model (its
config in the course's keys, its weights a course-layout model.pt: the engine carries those
readers alone), `--weights safetensors` one for a Hugging Face folder with one safetensors file
(SmolLM2's), `--weights any` one that reads Hugging Face configs and every weight format;
`--modules` lists each module's code lines.
"""

import argparse
import ast
import importlib.util
import json
import logging
import re
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from evaluator.toy_weights import save_toy_weights  # noqa: E402
from variants.presets import PRESETS  # noqa: E402
from variants.render import render_engine, render_source  # noqa: E402
from variants.variant import Variant  # noqa: E402

log = logging.getLogger("engine_size")
CONFIG = Path(__file__).resolve().parents[1] / "tests" / "data" / "tiny_config.json"


def section_lines(text: str) -> dict:
    """{section: n}: the non-blank lines of each section (the file's top, then each module under
    its `# ---- path ----` header) that are neither comments nor docstrings."""
    tree = ast.parse(text)
    docs: set = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docs.update(range(body[0].lineno, body[0].end_lineno + 1))
    counts, section = {}, "top"
    for n, line in enumerate(text.splitlines(), 1):
        header = re.match(r"# -{20} (\S+) -{20}", line)
        if header:
            section = header.group(1)
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and n not in docs:
            counts[section] = counts.get(section, 0) + 1
    return counts


def code_lines(text: str) -> dict:
    """{'kernels': n, 'rest': n}: non-blank lines that are neither comments nor docstrings, in
    the kernel modules and in the rest."""
    counts = {"kernels": 0, "rest": 0}
    for section, n in section_lines(text).items():
        counts["kernels" if section.startswith("variants/kernels/") else "rest"] += n
    return counts


def statement_share(variant: Variant, weights: str) -> float:
    """The share of the engine's statements that a short correctness pass runs on the CPU."""
    try:
        import coverage
    except ImportError:
        raise SystemExit("--coverage needs the coverage package: pip install coverage") from None
    config = json.loads(CONFIG.read_text())
    folder = Path(tempfile.mkdtemp())
    save_toy_weights(config, folder / "model.pt", seed=1)
    if weights == "safetensors":  # the same tensors in the file that engine reads
        from safetensors.torch import save_file

        state = torch.load(folder / "model.pt", weights_only=True)
        (folder / "model.pt").unlink()
        save_file({k: v.contiguous() for k, v in state.items()}, folder / "model.safetensors")
    path = render_engine(variant, folder / "engine.py", weights=weights)
    cov = coverage.Coverage(include=[str(path)], data_file=None)
    cov.start()
    spec = importlib.util.spec_from_file_location("engine_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    engine = module.create_engine(config, str(folder), "cpu")
    prompts = torch.randint(
        0, config["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(0)
    )
    engine.prefill(torch.tensor([1, 2]), prompts)
    for _ in range(3):
        engine.decode(torch.tensor([1, 2]), torch.tensor([5, 6]))
    engine.remove(torch.tensor([1]))
    engine.prefill(torch.tensor([3]), prompts[:1])
    engine.decode(torch.tensor([2, 3]), torch.tensor([5, 6]))
    cov.stop()
    _, statements, _, missing, _ = cov.analysis2(str(path))
    return 1 - len(missing) / len(statements)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", help="a Variant as JSON (default: every preset)")
    parser.add_argument("--coverage", action="store_true", help="also the statements run (CPU)")
    parser.add_argument("--modules", action="store_true", help="also the code lines per module")
    parser.add_argument(
        "--weights",
        choices=["course", "safetensors", "any"],
        default="course",
        help="the config and weight readers the engine carries (default: course)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        chosen = (
            {"variant": Variant.from_dict(json.loads(args.variant))} if args.variant else PRESETS
        )
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"--variant: {exc}") from None
    for name, variant in chosen.items():
        text = render_source(variant, weights=args.weights)
        counts = code_lines(text)
        row = f"{name:34s} lines {len(text.splitlines()):5d}  code: kernels {counts['kernels']:5d}"
        row += f"  rest {counts['rest']:5d}"
        if args.coverage:
            row += f"  statements run {statement_share(variant, args.weights):.0%}"
        log.info(row)
        if args.modules:
            ranked = sorted(section_lines(text).items(), key=lambda item: -item[1])
            for section, n in ranked:
                log.info("    %5d  %s", n, section)


if __name__ == "__main__":
    main()
