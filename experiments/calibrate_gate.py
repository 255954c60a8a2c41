"""Calibrate the noise gate: on toy models in float16 and bfloat16, on the CPU, measure the
reference's own rounding noise, then the error of honest engines that compute in that dtype in
another order and of each planted fault, in units of that noise. docs/CORRECTNESS_GATE.md holds
the table this prints.

    python experiments/calibrate_gate.py --json calibration.json          # every model (~2 h)
    python experiments/calibrate_gate.py --models tiny --dtypes bfloat16  # two rows, minutes
    python experiments/calibrate_gate.py --from-json calibration.json     # the table again

A cell is the worst row's error / its noise allowance (`noise_share` x the multiple): honest
engines over the whole case, planted faults at the row where the gate stopped them ("g" when
their greedy token failed first, "†" where a case was too noisy to judge at all). Needs a CPU
with float16/bfloat16 matmuls (any recent torch).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from evaluator.correctness import check_prepared, prepare_check  # noqa: E402
from evaluator.engine_loader import load_engine_module  # noqa: E402
from evaluator.gates import NOISE_MULTIPLE, NoiseGate  # noqa: E402
from evaluator.noise import measure_noise  # noqa: E402
from evaluator.toy_weights import save_toy_weights  # noqa: E402
from variants import Variant, build_engine  # noqa: E402

log = logging.getLogger("calibrate_gate")
ENGINES = REPO_ROOT / "tests" / "evaluator" / "engines"
TINY = json.loads((REPO_ROOT / "tests" / "data" / "tiny_config.json").read_text())
COURSE = json.loads((REPO_ROOT / "target" / "model_config.json").read_text())
LLAMA16 = {
    "model_type": "llama16",
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
}
# name -> (config, sharp (qk_scale, head_scale), cases). The sharp scales give attention score
# and logit standard deviations of a few units, as trained models have. max_position_embeddings
# is 1024 where the stress case runs: its prompt near the limit is otherwise minutes per engine.
MODELS = {
    "tiny": (TINY, (12.0, 10.0), ("public", "stress")),
    "gqa64": (
        {**TINY, "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256}
        | {"num_attention_heads": 8, "head_dim": 64, "max_position_embeddings": 256}
        | {"rope_theta": 500000.0},
        (8.0, 8.0),
        ("public", "stress"),
    ),
    "course": ({**COURSE, "max_position_embeddings": 1024}, (3.0, 4.0), ("public", "stress")),
    "llama16-scaled": (
        {**LLAMA16, "hidden_size": 1024, "intermediate_size": 4096},
        (3.0, 3.0),
        ("public", "stress"),
    ),
    "llama16": (LLAMA16, (2.0, 2.0), ("public",)),
}
HONEST = ("kv_cache_engine", "project")
FAULTS = (
    "rope_rotate_half_engine",
    "padded_last_token_engine",
    "wrong_remove_engine",
    "reprefill_appends_engine",
    "position_off_by_one_engine",
)
CASES = ("public", "stress")
FAULT_CASES = {"reprefill_appends_engine": ("stress",)}  # the public case prefills no live id


def engine_factory(name: str, dtype: torch.dtype):
    if name == "project":
        variant = Variant(cache="slab", attention="sdpa", dtype=str(dtype).removeprefix("torch."))
        return lambda config, weights, device: build_engine(config, weights, device, variant)
    module = load_engine_module(ENGINES / f"{name}.py")
    return functools.partial(module.create_engine, dtype=dtype)


def weights_for(model: str, kind: str, work_dir: Path) -> str:
    config, (qk, head), _ = MODELS[model]
    scales = {"qk_scale": qk, "head_scale": head} if kind == "sharp" else {}
    folder = work_dir / f"{model}-{kind}"
    if not (folder / "model.pt").is_file():
        log.info("writing %s toy weights to %s", kind, folder)
        save_toy_weights(config, folder / "model.pt", seed=1234, **scales)
    return str(folder)


def calibrate_one(model: str, kind: str, dtype_name: str, args) -> dict:
    """Noise and every engine's error in noise units for one model, weights kind and dtype."""
    config, _, cases = MODELS[model]
    cases = tuple(c for c in cases if c in args.cases)
    weight_dir = weights_for(model, kind, args.work_dir)
    dtype = getattr(torch, dtype_name)
    gate = NoiseGate(multiple=args.multiple, dtype=dtype_name)
    start = time.perf_counter()
    prepared = prepare_check(gate, config, weight_dir, "cpu", cases)
    f32 = measure_noise(config, weight_dir, "cpu", torch.float32, prepared.rows)
    record = {"model": model, "weights": kind, "dtype": dtype_name, "cases": {}}
    for case in cases:
        noise = prepared.judges.noise[case]
        rows = torch.cat(list(noise.row_noise.values()))
        record["cases"][case] = {
            "noise_floor": noise.floor,
            "noise_median": rows.median().item(),
            "noise_max": rows.max().item(),
            "float32_noise": f32[case].floor,
            "logit_std": torch.cat(list(noise.precise.values())).std(dim=-1).median().item(),
        }
    record["reference_seconds"] = round(time.perf_counter() - start, 1)
    record["engines"] = {}
    for name in tqdm((*HONEST, *FAULTS), desc=f"{model}/{kind}/{dtype_name}", leave=False):
        results = check_prepared(engine_factory(name, dtype), prepared)
        record["engines"][name] = {
            case: {
                "passed": r["passed"],
                "noise_ratio": r["noise_share"] * args.multiple,
                "tol_share": r["tol_share"],
                "greedy": f"{r['greedy_agreed']}/{r['greedy_checked']}",
                "failure": r["failure"],
            }
            for case, r in results.items()
        }
    return record


def unjudged(result: dict) -> bool:
    return "too large to judge" in (result["failure"] or "")


def cell(name: str, engine: dict) -> str:
    """Honest: the worst ratio over the judged cases. Fault: the least ratio it was stopped at
    over the cases that exercise it; "-" when none ran. A dagger marks a case the gate could not
    judge (the reference's noise covers the logits' spread: every engine fails it)."""
    dagger = "†" if any(unjudged(r) for r in engine.values()) else ""
    judged = {case: r for case, r in engine.items() if not unjudged(r)}
    if name in HONEST:
        if not judged:
            return dagger
        text = f"{max(r['noise_ratio'] for r in judged.values()):.2f}{dagger}"
        return text if all(r["passed"] for r in judged.values()) else f"**FAIL {text}**"
    exercised = [r for case, r in judged.items() if case in FAULT_CASES.get(name, CASES)]
    if not exercised:
        return dagger or "-"
    failed = [r for r in exercised if not r["passed"]]
    if not failed:
        return f"**PASS {max(r['noise_ratio'] for r in exercised):.2f}**{dagger}"
    least = min(failed, key=lambda r: r["noise_ratio"])
    greedy = "g" if "greedy token" in (least["failure"] or "") else ""
    return f"{least['noise_ratio']:.0f}{greedy}{dagger}"


def table(records: list[dict]) -> str:
    heads = ["model", "weights", "dtype", "noise", "f32 noise", "kv-cache", "project"]
    heads += ["course tol (project)", "rope", "padded", "stale remove", "re-prefill", "position"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in records:
        case = r["cases"].get("stress") or r["cases"]["public"]
        e = r["engines"]
        course = max(c["tol_share"] for c in e["project"].values())
        cells = [r["model"], r["weights"], r["dtype"], f"{case['noise_floor']:.2g}"]
        cells += [f"{case['float32_noise']:.1g}"] + [cell(n, e[n]) for n in HONEST]
        cells += [f"{course:.2g}"] + [cell(n, e[n]) for n in FAULTS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(MODELS)}")
    p.add_argument("--weights", default="default,sharp", help="default and/or sharp toy weights")
    p.add_argument("--dtypes", default="float16,bfloat16")
    p.add_argument("--cases", default="public,stress", help="cases to run where a model has them")
    p.add_argument("--multiple", type=float, default=NOISE_MULTIPLE, help="the gate's multiple")
    p.add_argument("--work-dir", type=Path, default=Path("/tmp/calibrate_gate"), help="weights")
    p.add_argument("--json", dest="json_path", type=Path, help="also write the records here")
    p.add_argument("--from-json", type=Path, help="print the table of records written before")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.from_json:
        print(table(json.loads(args.from_json.read_text())))
        return 0
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS] + [
        k for k in args.weights.split(",") if k not in ("default", "sharp")
    ]
    if unknown:
        print(f"error: unknown model or weights {unknown}", file=sys.stderr)
        return 2
    args.cases = tuple(args.cases.split(","))
    records = []
    for model in models:
        for kind in args.weights.split(","):
            for dtype in args.dtypes.split(","):
                records.append(calibrate_one(model, kind, dtype, args))
                log.info("%s", json.dumps(records[-1]))
                if args.json_path:
                    args.json_path.write_text(json.dumps(records, indent=1) + "\n")
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
