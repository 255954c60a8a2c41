"""Reading a stored study back: `report` (tables) and `render` (one trial's engine file)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from search import study as st
from search.errors import UserError
from search.records import Record
from search.report import summary, trial_line
from search.run_setup import ENGINES_ALIVE
from search.select import rank
from search.trial_worker import load_renderer
from variants.variant import Variant

log = logging.getLogger(__name__)


def open_existing(args):
    """The study of --storage/--study; without them, the one the last `run` wrote."""
    return st.locate_study(args.storage, args.study, args.studies_dir)


def report(args) -> int:
    study, url = open_existing(args)
    records = st.load_records(study)
    print(f"study {study.study_name} in {url}")
    print(summary(records, rank(records), args.top))
    best = study.user_attrs.get("verified_best")
    if best:
        print(
            f"\nverified best: trial {best['trial']} {best['variant_name']} "
            f"({best['tokens_per_s']:.1f} tokens/s, verified {best['verified_at']})"
        )
    if args.all:
        print("\nAll trials:")
        for r in records:
            print(trial_line(r))
    if not getattr(args, "no_plots", False):
        from search.summary_md import default_report_dir, write_report

        out = (
            Path(args.out)
            if args.out
            else default_report_dir(url, study.study_name, args.studies_dir)
        )
        paths = write_report(study, out, args.top, getattr(args, "sweep", None))
        print(f"\nwrote {len(paths)} file(s) in {out}: " + ", ".join(p.name for p in paths))
    print(f"\ndashboard: {st.dashboard_command(url)}")
    return 0


def _pick(study, records: list[Record], number: int | None) -> Record:
    if number is None:
        best = study.user_attrs.get("verified_best")
        number = best["trial"] if best else None
    if number is None:
        ranked = rank(records)
        if not ranked:
            raise UserError("the study has no correct trial to render; run more trials")
        return ranked[0]
    for r in records:
        if r.number == number and r.variant:
            return r
    best = study.user_attrs.get("verified_best") or {}
    if best.get("trial") == number:
        return Record(number, "ok", best["variant"], {"variant_name": best["variant_name"]})
    raise UserError(f"trial {number} has no variant in study {study.study_name}; see `report`")


def render(args) -> int:
    study, _ = open_existing(args)
    record = _pick(study, st.load_records(study), args.trial)
    variant = Variant.from_dict(record.variant)
    header = f"variant {variant.name} from study {study.study_name}, trial {record.number}"
    budget = study.user_attrs.get("memory_budget_gib")
    engine_budget = None if budget is None else budget / ENGINES_ALIVE
    path = load_renderer(args.renderer)(variant, Path(args.output), header, engine_budget)
    print(f"wrote {path or args.output}: trial {record.number} {variant.name}")
    print(json.dumps(variant.to_dict(), sort_keys=True))
    return 0
