"""Which engines a shape sweep measures: `--variant` specs (a preset name of
variants.presets.PRESETS, a JSON object of Variant fields, or LABEL=JSON) and a study's leaders
(its verified best, then its best distinct correct trials).
"""

from __future__ import annotations

import json

from search.errors import UserError
from search.records import Record
from variants.presets import PRESETS
from variants.variant import Variant


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
    from search.study import load_records

    best = study.user_attrs.get("verified_best") or {}
    return leaders(best, load_records(study), top, compile)


def leaders(best: dict, records: list[Record], top: int, compile: bool = True):
    """[(label, Variant)]: the verified best (`best`, the study attribute), then the distinct
    correct trials in search.select.rank's order, up to `top`; `compile=False` leaves out those
    with execution=compile."""
    from search.select import rank

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
