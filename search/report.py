"""Plain-text tables of a study's trials: the top-N table, per-trace numbers, one line per trial.

Shared by `python -m search report` (reading any storage) and `workspace/results.log`.
"""

from __future__ import annotations

from search.records import Record
from search.trial_worker import OBJECTIVE_TRACES


def _num(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and abs(value) >= 1e4:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else str(value)


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True))
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)]).rstrip()


def trace_names(records: list[Record]) -> list[str]:
    """Traces measured in any record, the objective's order first."""
    names = {name for r in records for name in r.trace_numbers()}
    names |= {name for r in records for name in r.trace_numbers("full_")}
    known = [n for n in OBJECTIVE_TRACES if n in names]
    return known + sorted(names - set(known))


def top_table(ranked: list[Record], n: int = 5) -> str:
    """The leaders in rank order: screening and full-protocol throughput in their own columns,
    the peak, and tokens/s per trace (full-protocol numbers where measured)."""
    if not ranked:
        return "(no correct trial)"
    traces = trace_names(ranked)
    header = ["rank", "trial", "variant", "screening tok/s", "full tok/s", "grader peak MiB"]
    header += [f"{t} tok/s" for t in traces] + ["max err", "tol share"]
    rows = []
    for i, r in enumerate(ranked[:n], 1):
        per = r.trace_numbers("full_" if r.has_full else "")
        full = r.attrs.get("full_tokens_per_s")
        row = [str(i), str(r.number), r.name, _num(r.screening_tokens_per_s), _num(full)]
        row.append(_num(r.peak_mib, 0))
        row += [_num(per.get(t, {}).get("tps")) for t in traces]
        err = r.attrs.get("max_abs_err")
        row += ["-" if err is None else f"{err:.3g}", _num(r.attrs.get("tol_share"), 3)]
        rows.append(row)
    return _table(header, rows)


def trace_table(record: Record) -> str:
    """Per trace: tokens/s, decode tokens/s, floor efficiency, seconds (quick and full)."""
    rows = []
    for prefix, label in (("", "quick"), ("full_", "full")):
        numbers = record.trace_numbers(prefix)
        for name in trace_names([record]):
            if name not in numbers:
                continue
            t = numbers[name]
            rows.append(
                [
                    name,
                    label,
                    _num(t.get("tps")),
                    _num(t.get("decode_tps")),
                    _num(t.get("floor_eff"), 3),
                    _num(t.get("seconds"), 4),
                ]
            )
    if not rows:
        return "(no measurements)"
    header = ["trace", "protocol", "tok/s", "decode tok/s", "floor eff", "seconds"]
    return _table(header, rows)


def trial_line(r: Record) -> str:
    """One trial: variant, status, error and tolerance, throughput per trace, or the reason."""
    head = f"#{r.number:<3d} {r.status:<10s} {r.name}"
    a = r.attrs
    err = ""
    if a.get("max_abs_err") is not None:
        err = (
            f" | max err {a['max_abs_err']:.3g} ({a.get('gate', 'course')} gate; tol share "
            f"{_num(a.get('tol_share'), 3)} of atol {a.get('atol')} rtol {a.get('rtol')}, noise "
            f"share {_num(a.get('noise_share'), 3)})"
        )
    if a.get("duplicate_of") is not None:
        head += f" (same variant as #{a['duplicate_of']})"
    if r.status in ("ok", "duplicate") and r.values:
        per = r.trace_numbers()
        traces = ", ".join(
            f"{n} {_num(per[n].get('tps'))}/{_num(per[n].get('decode_tps'))}"
            f" eff {_num(per[n].get('floor_eff'), 3)}"
            for n in trace_names([r])
            if n in per
        )
        peak = f"peak {_num(a.get('peak_mib'), 0)} MiB"
        if a.get("engine_peak_mib") is not None:  # the peak is the grader's pattern's
            peak = (
                f"peak {_num(a.get('peak_mib'), 0)} MiB in the grader's pattern "
                f"({_num(a.get('engine_peak_mib'), 0)} one engine)"
            )
        body = (
            f" | {_num(a.get('tokens_per_s'))} tok/s gmean, {peak},"
            f" create {_num(a.get('create_s'), 2)} s | tok/s/decode tok/s per trace: {traces}"
        )
        if r.has_full:
            body += f" | full protocol {_num(a.get('full_tokens_per_s'))} tok/s"
        return head + err + body
    if r.status == "waiting":
        return head + " (queued, not run)"
    if r.status == "running":
        return head + " (still running, or its process died)"
    reason = (a.get("reason") or a.get("full_reason") or "").strip().splitlines()
    first = reason[0] if reason else ""
    return head + err + (f" | {first}" if first else "")


def failure_details(records: list[Record]) -> str:
    """The tail of each failed trial's output (the reason is long; it goes last in the log)."""
    parts = []
    for r in records:
        reason = (r.attrs.get("reason") or "").strip()
        if r.status in ("failed", "infeasible") and reason and r.attrs.get("duplicate_of") is None:
            parts.append(f"--- trial {r.number} ({r.name}, {r.status}) ---\n{reason}")
    return "\n".join(parts) or "(none)"


def summary(records: list[Record], ranked: list[Record], n: int = 5) -> str:
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1
    status = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    parts = [f"{len(records)} trials: {status}", "", f"Top {n}:", top_table(ranked, n)]
    if ranked:
        parts += ["", f"Per trace, trial {ranked[0].number} ({ranked[0].name}):"]
        parts.append(trace_table(ranked[0]))
    return "\n".join(parts)
