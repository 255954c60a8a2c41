"""`python -m search sweep`: measure engines over shapes (search.shape_sweep) and write the JSON
that `python -m search report` draws.

Variants come from --variant (a preset name of variants.presets.PRESETS, or a JSON object of
Variant fields such as '{"cache": "paged", "block_size": 64}', the other fields keeping their
defaults, optionally named as LABEL=JSON), or from a study: its verified best, then its best
distinct correct trials (search.sweep_variants). run.sh's short sweep is search.sweep_leaders.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from search.errors import UserError
from search.sweep_variants import study_variants, variant_from_spec
from variants.presets import PRESETS

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


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)


def _study_and_out(args):
    """(variants, default output path, model config, weight dir) from --study, or Nones."""
    if not (args.storage or args.study):
        return None, Path(SWEEP_FILE), args.model_config, args.weight_dir
    from search import study as st
    from search.summary_md import default_report_dir

    study, url = st.locate_study(args.storage, args.study, args.studies_dir)
    config = args.model_config or study.user_attrs.get("model_config_path")
    weights = args.weight_dir or study.user_attrs.get("weight_dir")
    out = default_report_dir(url, study.study_name, args.studies_dir) / SWEEP_FILE
    return study_variants(study, args.top, not args.no_compile), out, config, weights


def sweep_command(args) -> int:
    from search.run_setup import resolve_device
    from search.shape_sweep import sweep
    from search.target import resolve_target
    from variants.probe import probe_capabilities

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
