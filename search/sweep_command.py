"""`python -m search sweep`: measure engines over shapes (sweep.measure) and write the JSON that
`python -m search report` draws; and the short sweep of a study's leaders at the end of run.sh
(its time in the budget: search.setup's `sweep_reserve_s`).

Variants come from --variant (a preset name of variants.presets.PRESETS, or a JSON object of
Variant fields such as '{"cache": "paged", "block_size": 64}', the other fields keeping their
defaults, optionally named as LABEL=JSON), or from a study: its verified best, then its best
distinct correct trials (`study_variants`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from search.report import default_report_dir
from search.setup import (
    BUILDS_GPU_S,
    MIN_GPU_LIMIT_S,
    PIPELINE_LIMIT_S,
    WRAP_UP_S,
    device_kind,
)
from search.trial import Record, run_child, tail, write_atomic
from search.write import rank
from sweep.measure import sweep
from variants.checkpoint.preflight import resolve_target
from variants.presets import PRESETS
from variants.probe import UserError, probe_capabilities, resolve_device
from variants.variant import Variant

log = logging.getLogger(__name__)

SWEEP_FILE = "sweep.json"
PIPELINE_TOP = 3  # the variants run.sh sweeps, and --top's default


def add_arguments(p) -> None:
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help="a preset name (" + ", ".join(PRESETS) + "), a JSON object of Variant fields, or "
        "LABEL=JSON to name one in the tables and legends; repeat for several",
    )
    p.add_argument(
        "--top",
        type=int,
        default=PIPELINE_TOP,
        help="with --study: how many of its variants (default 3)",
    )
    p.add_argument(
        "--out",
        help="JSON file to write (default with a study: studies/<study>/sweep.json, "
        "where `report` finds it; else sweep.json)",
    )
    p.add_argument("--batches", type=_ints, help="decode batch sizes (default 1,2,4,...,64)")
    p.add_argument("--context", type=int, help="decode context in tokens (default 256)")
    p.add_argument(
        "--lengths",
        type=_ints,
        help="prefill prompt lengths (default 16,64,...,4096; capped at max_position_embeddings)",
    )
    p.add_argument(
        "--repeats", type=int, help="timed calls per shape (default 20 decode, 5 prefill)"
    )
    p.add_argument("--time-limit", type=float, help="stop adding shapes after this many seconds")
    p.add_argument("--ceilings", help="device ceilings as JSON (default: measured here)")
    p.add_argument("--no-floor", action="store_true", help="leave out the floor model")
    p.add_argument("--seed", type=int, default=0, help="seed of the random token ids (0)")
    p.add_argument(
        "--no-probe",
        action="store_true",
        help="skip the capability check of the variants "
        "(run.sh passes ones it has verified on this machine)",
    )
    p.add_argument(
        "--no-compile",
        action="store_true",
        help="with --study: leave out torch.compile "
        "variants (on a CPU their build alone takes longer than a small sweep)",
    )


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text!r}") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers: {text!r}")
    return values


def _study_and_out(args):
    """(variants, default output path, model config, weight dir) from --study (without it or
    --variant, the last run's), or Nones."""
    if args.variant and not (args.storage or args.study):
        return None, Path(SWEEP_FILE), args.model_config, args.weight_dir
    from search.study import locate_study  # (Optuna: imported where a study is read)

    study, url = locate_study(args.storage, args.study, args.studies_dir)
    config = args.model_config or study.user_attrs.get("model_config_path")
    weights = args.weight_dir or study.user_attrs.get("weight_dir")
    out = default_report_dir(url, study.study_name, args.studies_dir) / SWEEP_FILE
    return study_variants(study, args.top, not args.no_compile), out, config, weights


def sweep_command(args) -> int:
    variants = [variant_from_spec(v) for v in args.variant]
    from_study, out, config_path, weight_dir = _study_and_out(args)
    variants += from_study or []
    if not variants:
        raise UserError("give --variant NAME_OR_JSON (repeatable) or --study NAME")
    out = Path(args.out) if args.out else out
    device = resolve_device(args.device)
    target = resolve_target(config_path, weight_dir)
    runnable = variants
    if not args.no_probe:
        caps = probe_capabilities(device, target.config)
        runnable = []
        for name, variant in variants:
            why = caps.why_invalid(variant)
            if why is None:
                runnable.append((name, variant))
            else:
                print(f"skipped {name}: not runnable on {device} ({why})")
    if not runnable:
        print("error: no variant to measure", file=sys.stderr)
        return 2
    options = {}
    for key, name in (("batches", "batches"), ("context", "context"), ("lengths", "lengths")):
        if getattr(args, name) is not None:
            options[key] = getattr(args, name)
    if args.repeats is not None:
        options["decode_repeats"] = options["prefill_repeats"] = args.repeats
    print(f"sweep of {len(runnable)} variant(s) on {device}, model {target.config_path}")
    start = time.monotonic()
    result = sweep(
        target.config,
        str(target.weight_dir),
        device,
        runnable,
        time_limit_s=args.time_limit,
        ceilings=json.loads(args.ceilings) if args.ceilings else None,
        floor=not args.no_floor,
        seed=args.seed,
        progress=lambda line: print(line, flush=True),
        on_variant=lambda partial: write_json(out, partial),
        **options,
    )
    write_json(out, result)
    measured = [v for v in result["variants"] if v["decode"] or v["prefill"]]
    print(
        f"wrote {out}: {len(measured)} of {len(runnable)} variant(s) measured in "
        f"{time.monotonic() - start:.1f} s"
    )
    for v in result["variants"]:
        if v.get("skipped"):
            print(f"  {v['name']}: {len(v['skipped'])} shape(s) skipped (time limit or memory)")
        if v.get("error"):
            print(f"  {v['name']}: FAILED: {v['error']}")
    return 0 if measured else 1


def variant_from_spec(text: str) -> tuple[str, Variant]:
    """A preset name, a JSON object of Variant fields, or LABEL=JSON: (label, Variant)."""
    if text in PRESETS:
        return text, PRESETS[text]
    label, sep, fields = text.partition("={")
    label, fields = (label.strip(), "{" + fields) if sep else ("", text)
    if fields.lstrip().startswith("{"):
        try:
            variant = Variant.from_dict(json.loads(fields))
        except (ValueError, TypeError) as exc:
            raise UserError(f"--variant {text!r}: {exc}") from exc
        return label or variant.name, variant
    raise UserError(
        f"--variant {text!r} is neither a preset ({', '.join(PRESETS)}) nor a JSON "
        "object of Variant fields (or LABEL=JSON)"
    )


def study_variants(study, top: int, compile: bool = True) -> list[tuple[str, Variant]]:
    """The verified best, then the best distinct correct trials of a study (see `leaders`)."""
    from search.study import load_records  # (Optuna)

    best = study.user_attrs.get("verified_best") or {}
    return leaders(best, load_records(study), top, compile)


def leaders(best: dict, records: list[Record], top: int, compile: bool = True):
    """[(label, Variant)]: the verified best (`best`, the study attribute), then the distinct
    correct trials in search.write.rank's order, up to `top`; `compile=False` leaves out those
    with execution=compile."""
    candidates = []
    if best.get("variant"):
        candidates.append(Record(best.get("trial", -1), "ok", best["variant"], {"chosen": True}))
    candidates += rank(records)
    out, seen = [], set()
    for r in candidates:
        key = json.dumps(r.variant, sort_keys=True)
        try:
            variant = Variant.from_dict(r.variant)
        except (ValueError, TypeError):  # a trial of an older Variant: not buildable now
            continue
        if key in seen or (not compile and variant.execution == "compile"):
            continue
        seen.add(key)
        label = f"#{r.number}" if r.number >= 0 else "default"
        label += " (chosen) " if r.attrs.get("chosen") else " "
        out.append((label + variant.name, variant))
    return out[:top]


# run.sh: the defaults on a GPU (for the time search.setup's PIPELINE_LIMIT_S gives it); on a
# CPU small shapes, and no torch.compile variant (its build alone outlasts the sweep's time)
PIPELINE_SETTINGS = {
    "cpu": ["--batches", "1,2,4", "--lengths", "16,64", "--repeats", "2"],
    "cuda": [],
}
PIPELINE_COMPILE = {"cpu": False, "cuda": True}
PIPELINE_TIMEOUT_S = {"cpu": 120.0, "cuda": 400.0}  # engine builds come on top of the limit
# A CPU sweep's process start and engine builds on top of its shapes, and the fewest seconds of
# shapes worth a process: with less left of the budget it is not run.
STARTS_CPU_S = 5.0
MIN_CPU_LIMIT_S = 2.0


def sweep_leaders(job, reuse: bool) -> list[str]:
    """Sweep the study's best (up to 3) distinct correct variants in a child process into
    `<study dir>/sweep.json`, next to the report; returns notes for results.log. An existing
    sweep.json of the same variants and device stays where `reuse` (a resumed study) or where
    it measured every shape (a `sweep` command's, fuller than a run's time-limited one). Never
    raises.
    The child gets the variants by value and skips the probe: it then imports neither Optuna
    nor torch._dynamo, a few seconds less on a CPU."""
    out = default_report_dir(job.storage_url, job.study_name, job.args.studies_dir) / SWEEP_FILE
    try:
        kind = device_kind(job.device)
        chosen = study_variants(job.study, PIPELINE_TOP, PIPELINE_COMPILE[kind])
        wanted = [v.to_dict() for _, v in chosen]
        left_out = "" if PIPELINE_COMPILE[kind] else " (torch.compile variants left out on a CPU)"
        if not wanted:
            return [f"shape sweep: no variant to sweep{left_out}"]
        if kept := _kept_sweep(out, wanted, job.device, reuse):
            return [f"shape sweep: kept {out} ({kept})"]
        limit = sweep_limit(kind, job.seconds_left())
        if limit is None:
            return [f"shape sweep: not run, {job.seconds_left():.0f} s of the budget left"]
        cmd = [sys.executable, "-m", "search", "sweep", "--out", str(out.resolve()), "--no-probe"]
        for name, variant in chosen:
            cmd += ["--variant", f"{name}={json.dumps(variant.to_dict())}"]
        cmd += ["--model-config", str(job.target.config_path)]
        cmd += ["--weight-dir", str(job.target.weight_dir), "--device", job.device]
        cmd += PIPELINE_SETTINGS[kind]
        cmd += ["--time-limit", f"{limit:.0f}"]
        if job.runner.ceilings:
            cmd += ["--ceilings", json.dumps(job.runner.ceilings)]
        out.parent.mkdir(parents=True, exist_ok=True)
        log_path = out.with_name("sweep.log")
        log.info("shape sweep of %d variant(s) into %s", len(wanted), out)
        code, seconds = run_child(cmd, log_path, PIPELINE_TIMEOUT_S[kind])
    except Exception as exc:  # a diagram is not worth the engine
        log.warning("the shape sweep failed: %r", exc)
        return [f"shape sweep failed: {exc!r}"]
    status = "timed out" if code is None else f"exit {code}"
    note = (
        f"shape sweep of {len(wanted)} variant(s){left_out} ({status}, {seconds:.0f} s): {out}, "
        f"output in {log_path}"
    )
    if code != 0:
        log.warning("the shape sweep ended with %s:\n%s", status, tail(log_path, 1500))
        note += " — " + (tail(log_path, 300).splitlines() or ["no output"])[-1]
    return [note]


def sweep_limit(kind: str, seconds_left: float) -> float | None:
    """Seconds of shapes for the sweep: what is left of the job's budget once its start (on a
    GPU its builds) and the steps after it are counted, on a GPU within 20-90 s, on a CPU at
    most 10 s, and on a CPU None (no sweep) where that is under 2 s."""
    if kind == "cpu":
        shapes_s = min(PIPELINE_LIMIT_S["cpu"], seconds_left - STARTS_CPU_S - WRAP_UP_S)
        return shapes_s if shapes_s >= MIN_CPU_LIMIT_S else None
    shapes_s = seconds_left - BUILDS_GPU_S - WRAP_UP_S  # (the figures, results.log)
    return max(MIN_GPU_LIMIT_S, min(PIPELINE_LIMIT_S["cuda"], shapes_s))


def _kept_sweep(path: Path, variants: list[dict], device: str, reuse: bool) -> str | None:
    """Why the sweep at `path` stays (see sweep_leaders), or None to sweep again."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    entries = old.get("variants") or []
    same = old.get("device") == device and [v.get("variant") for v in entries] == variants
    if not same or any(v.get("error") for v in entries):
        return None
    if reuse:
        return "same variants, same device"
    cut = [s for v in entries for s in v.get("skipped") or [] if s.get("why") == "time limit"]
    return None if cut else "same variants, same device, every shape measured"


def write_json(path: Path, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=1, sort_keys=False) + "\n")
