"""What a run leaves for people: `workspace/results.log` and its tables (plain text; neither
Optuna nor matplotlib needed), which the `report` command (search.cli) prints with
search.figures' figures and summary.md; and the `render` command (one trial's engine file)."""

from __future__ import annotations

import json
import logging
import re
import statistics
from collections import Counter
from pathlib import Path

from search.kernel_phase import lines as kernel_lines
from search.setup import ENGINES_ALIVE
from search.trial import NEAREST, OBJECTIVE_TRACES, Record, load_renderer
from search.write import MEMORY_TIE, TIE, Attempt, installed, rank
from variants.probe import UserError
from variants.variant import Variant

log = logging.getLogger(__name__)


# --- plain-text tables (`report` and results.log) --------------------------------------------


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
    the peak (the grader's pattern's where the full protocol ran, else one engine's), and
    tokens/s per trace (full-protocol numbers where measured)."""
    if not ranked:
        return "(no correct trial)"
    traces = trace_names(ranked)
    header = ["rank", "trial", "variant", "screening tok/s", "full tok/s", "peak MiB"]
    header += [f"{t} tok/s" for t in traces] + ["max err", "tol share"]
    rows = []
    for i, r in enumerate(ranked[:n], 1):
        per = r.trace_numbers("full_" if r.has_full else "")
        full = r.attrs.get("full_tokens_per_s")
        row = [str(i), str(r.number), r.name, _num(r.screening_tokens_per_s), _num(full)]
        row.append(_num(r.peak_mib, 0) + ("" if r.has_full else " (1 engine)"))
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
            cells = [_num(t.get("tps")), _num(t.get("decode_tps")), _num(t.get("floor_eff"), 3)]
            rows.append([name, label, *cells, _num(t.get("seconds"), 4)])
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
        # screening holds one engine; a study's older trials ran in the grader's pattern
        peak += " in the grader's pattern" if a.get("grader_peak_mib") else " with one engine"
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


def status_counts(records: list[Record]) -> str:
    """`failed 1, ok 20, ...`: how many trials ended in each status."""
    counts = Counter(r.status for r in records)
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def summary(records: list[Record], ranked: list[Record], n: int = 5) -> str:
    status = status_counts(records)
    parts = [f"{len(records)} trials: {status}", "", f"Top {n}:", top_table(ranked, n)]
    if ranked:
        parts += ["", f"Per trace, trial {ranked[0].number} ({ranked[0].name}):"]
        parts.append(trace_table(ranked[0]))
    return "\n".join(parts)


# --- workspace/results.log -------------------------------------------------------------------


def _section(title: str, body: str) -> str:
    return f"== {title} ==\n{body.rstrip()}\n"


RANKING = (
    "Ranking: correct trials only (within half the tolerance), one per assembly; the leaders "
    "re-measured with the grader's full protocol first, by those numbers, then the others by "
    "their screening numbers; within 1 % the smaller peak memory first where it is more than 5 % "
    "smaller, else the faster. The first that passes verification is written."
)


NONE_RAN = (
    "no trial ran: the budget ended before the first (the warm-up and the time kept for "
    "verification and the sweep took it; a longer --budget-minutes measures the assemblies)"
)


def _why(chosen: Record, ranked: list[Record], ran: bool = True, contest=None) -> str:
    """Why `chosen` was written; `ran`: whether any trial ran to a result; `contest`: the
    kernel search's of the leader and a close rival (search.kernel_phase.Contest), if any."""
    if chosen.number < 0:
        why = "no measured trial passed verification" if ran else NONE_RAN
        return (
            f"{chosen.name}: a ranked default that was not measured here; {why}, so the "
            "safest default that passes verification was written."
        )
    if chosen.has_full:  # the written engine's figures: the grader's protocol, not one screening
        protocol = (
            "full protocol: the grader's pattern, a fresh engine for each of three repeats; "
            f"screening had {chosen.screening_tokens_per_s:.1f}"
        )
    else:
        protocol = "screening on one engine; not re-measured with the full protocol"
    a = chosen.attrs
    share = (  # the share of the gate that judged it (search.trial.constraint's)
        f"{_num(a.get('noise_share'), 2)} of the noise gate's limit"
        if a.get("gate") == "noise"
        else f"{_num(a.get('tol_share'), 2)} of the tolerance"
    )
    text = (
        f"{chosen.name} (trial {chosen.number}): {chosen.tokens_per_s:.1f} tokens/s "
        f"(geometric mean, {protocol}), peak {chosen.peak_mib:.0f} MiB, "
        f"max error {a.get('max_abs_err', float('nan')):.3g} ({share})."
    )
    others = [r for r in ranked if r.number != chosen.number]
    if not others:
        return text + "\nIt was the only correct candidate.\n" + RANKING
    up = others[0]  # both by one protocol: the full one when both have it
    if chosen.has_full and up.has_full:
        mine, theirs, protocol = chosen.tokens_per_s, up.tokens_per_s, "full protocol"
    else:
        mine, theirs = chosen.screening_tokens_per_s, up.screening_tokens_per_s
        protocol = "screening"
    ratio = mine / theirs if theirs else float("inf")
    text += (
        f"\nRunner-up: {up.name} (trial {up.number}): {theirs:.1f} against {mine:.1f} tokens/s "
        f"({protocol}, both), peak {up.peak_mib:.0f} MiB: the chosen one is {ratio:.3f}x its "
        "throughput"
    )
    if contest is not None and contest.won and chosen.number == contest.rival.number:
        mine, theirs = contest.estimates[1], contest.estimates[0]
        text += (
            f" (the kernel search decided: with the tables {mine:,.0f} against {theirs:,.0f} "
            "tokens/s)"
        )
    elif 1 - TIE < ratio < 1:
        text += f" (a tie within 1 %: the peak memory, more than {MEMORY_TIE:.0%} smaller, decided)"
    text += "."
    if ranked and ranked[0].number != chosen.number:
        text += "\nHigher-ranked trial(s) failed verification: see below."
    return text + "\n" + RANKING


def _verification(attempts: list[Attempt]) -> str:
    if not attempts:
        return "(nothing was verified)"
    parts = []
    for a in attempts:
        head = f"-- trial {a.record.number} {a.record.name}: "
        if a.verification is None:
            parts.append(head + (a.error or "not verified"))
            continue
        v = a.verification
        head += f"{'PASSED' if v.passed else 'FAILED'} in {v.seconds:.1f} s ({'; '.join(v.steps)})"
        parts.append(f"{head}\n{v.output}")
    return "\n".join(parts)


def trial_time(records: list[Record]) -> str:
    """Where a screened trial's time goes: each phase's median over the trials that timed it."""
    timed = [
        r.attrs["phase_seconds"]
        for r in records
        if r.attrs.get("phase_seconds") and r.attrs.get("protocol", "quick") == "quick"
    ]
    if not timed:
        return ""
    names = list(dict.fromkeys(name for p in timed for name in p))
    parts = [f"{n} {statistics.median(p[n] for p in timed if n in p):.1f} s" for n in names]
    ahead = sum(bool(r.attrs.get("checked_ahead")) for r in records)
    took = (
        f"; {ahead} took the correctness verdict their warm-up child reached on the same engine "
        "file (the gate not run again)"
        if ahead
        else ""
    )
    return f"\na trial's time (medians of {len(timed)}): " + ", ".join(parts) + took


def beyond_presets(chosen: Record, records: list[Record]) -> str:
    """What the sampler found beyond the queued presets: its best correct assembly against the
    best preset, trace by trace (screening numbers, which every trial has), and the axes where
    they differ."""
    known = lambda r: r.attrs.get("source") not in (None, NEAREST)  # noqa: E731 (queued first)
    correct = [r for r in records if r.status == "ok" and r.feasible]
    queued = [r for r in correct if known(r)]
    sampled = [r for r in correct if not known(r)]
    if all(r.status == "waiting" for r in records):
        return f"beyond the presets: {NONE_RAN}"
    proposed = [r for r in records if r.status not in ("waiting", "skipped") and not known(r)]
    copies = sum(r.attrs.get("duplicate_of") is not None for r in proposed)
    nearest = sum(r.attrs.get("source") == NEAREST for r in proposed)
    tried = len(proposed) - copies  # (a proposal of an assembly already run is not run again)
    if copies:
        tried = f"{tried} trial(s) (and proposed {copies} already run, not run again"
        tried += (
            f"; in their place {nearest} untried one(s) nearest the leader)" if nearest else ")"
        )
    else:
        tried = f"{tried} trial(s)"
    if not proposed:
        return "beyond the presets: the sampler ran no trial (the budget went to the presets)"
    if not queued:
        return f"beyond the presets: no queued assembly was timed; the sampler ran {tried}"
    if not sampled:
        return f"beyond the presets: the sampler ran {tried}, none correct and timed"
    best = max(sampled, key=lambda r: r.screening_tokens_per_s)
    preset = max(queued, key=lambda r: r.screening_tokens_per_s)
    ratio = best.screening_tokens_per_s / preset.screening_tokens_per_s
    verdict = "beat" if ratio > 1 else "did not beat"
    lines = [
        f"beyond the presets: the sampler ran {tried}; its best, trial {best.number}, "
        f"{verdict} the best queued one ({preset.attrs['source']}, trial {preset.number}): "
        f"{ratio:.3f}x on the geometric mean (screening)"
        + (" and is the one written" if best.number == chosen.number else "")
    ]
    per = [
        f"{n} {best.attrs[f'tps_{n}'] / preset.attrs[f'tps_{n}']:.3f}x"
        for n in trace_names([best, preset])
        if best.attrs.get(f"tps_{n}") and preset.attrs.get(f"tps_{n}")
    ]
    lines.append("per trace: " + ", ".join(per))
    a, b = best.variant or {}, preset.variant or {}
    moved = [f"{k}={a.get(k)} (preset: {b.get(k)})" for k in sorted(a) if a.get(k) != b.get(k)]
    lines.append("where they differ: " + (", ".join(moved) or "nowhere"))
    return "\n".join(lines)


def contest_section(contest) -> str:
    """The results log's section on the kernel search of the contender not written
    (search.kernel_phase.Contest)."""
    other = contest.searches[0 if contest.won else 1]
    title = f"kernel search of the {'leader' if contest.won else 'close rival'}, not written"
    return _section(title, contest.lines() + "\n" + kernel_lines(other))


def render_log(job, records: list[Record], ranked: list[Record], attempts: list[Attempt]) -> str:
    """The results log of a main job (search.cli.RunJob) once its phases are done."""
    out = [f"# results of: python -m search {job.args.command_line}\n"]
    env = "\n".join(f"{k}: {v}" for k, v in job.environment.items())
    out.append(_section("environment", env))
    target = job.target.describe()
    config = target.pop("config", {})
    body = "\n".join(f"{k}: {v}" for k, v in target.items())
    out.append(_section("target", body + "\nconfig: " + json.dumps(config, sort_keys=True)))
    space = "\n".join(
        f"{name}: {', '.join(map(str, choices))}" for name, choices in job.space.describe()
    )
    space += f"\n({job.space.size} assemblies; capabilities: {json.dumps(job.caps.to_dict())})"
    out.append(_section("search space (axes and the choices offered here)", space))
    notes = job.notes + job.target.notes
    if notes:
        out.append(_section("notes", "\n".join(notes)))
    trials = "\n".join(trial_line(r) for r in sorted(records, key=lambda r: r.number))
    minutes = job.phases.get("search", 0.0) / 60
    timed = len(job.runner.screened)  # this run's trials that ran to a result (or a prune)
    if minutes > 0 and timed:
        rate = f"this run: {timed} in {minutes:.1f} min of search, {timed / minutes:.1f} a minute"
        trials = f"{rate}{trial_time(records)}\n{trials}"
    copies = sum(r.attrs.get("duplicate_of") is not None for r in records)
    skipped = sum(r.status == "skipped" for r in records)  # (asked ahead, never reached)
    parts = [f"{copies} of them the sampler's copies"] if copies else []
    parts += [f"{skipped} skipped"] if skipped else []
    count = f"{len(records)}: {' and '.join(parts)}, not run" if parts else ""
    out.append(_section(f"trials ({count or len(records)})", trials or "(none)"))
    out.append(_section("top 5", top_table(ranked, 5)))
    done = installed(attempts)
    chosen = "NONE: no candidate passed verification; engine.py untouched"
    if done is not None:
        r = done.record
        ran = any(record.status != "waiting" for record in records)
        contest = getattr(job, "contest", None)
        chosen = _why(r, ranked, ran, contest) + "\nvariant: "
        chosen += json.dumps(r.variant, sort_keys=True)
        chosen += "\n\n" + trace_table(r)
        chosen += "\n\n" + beyond_presets(r, records)
    out.append(_section("chosen", chosen))
    if getattr(job, "kernels", None) is not None:
        title = "kernel search (the decode and prefill attention's and few-row kernels' launches)"
        out.append(_section(title, kernel_lines(job.kernels)))
    if getattr(job, "contest", None) is not None:
        out.append(contest_section(job.contest))
    out.append(_section("verification", _verification(attempts)))
    phases = "\n".join(f"{name}: {secs:.1f} s" for name, secs in job.phases.items())
    out.append(_section("time per phase", phases))
    if job.storage_url:
        where = f"storage: {job.storage_url}\nstudy: {job.study_name}"
        out.append(_section("study", f"{where}\ndashboard: {job.dashboard}"))
    out.append(_section("failure details", failure_details(records)))
    return "\n".join(out)


def default_report_dir(url: str, study_name: str, studies_dir: str | Path = "studies") -> Path:
    """`<dir of the SQLite file or journal>/<study>/`, else (a database server)
    `<studies_dir>/<study>/`."""
    from search.study import storage_file  # (Optuna: imported where a study is read)

    path = storage_file(url)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", study_name)
    return (path.parent if path else Path(studies_dir)) / safe


# --- `python -m search render` ---------------------------------------------------------------


def _pick(study, records: list[Record], number: int | None) -> Record:
    best = study.user_attrs.get("verified_best") or {}
    number = best.get("trial") if number is None else number
    if number is None:
        ranked = rank(records)
        if not ranked:
            raise UserError("the study has no correct trial to render; run more trials")
        return ranked[0]
    for r in records:
        if r.number == number and r.variant:
            return r
    if best.get("trial") == number:
        return Record(number, "ok", best["variant"], {"variant_name": best["variant_name"]})
    raise UserError(f"trial {number} has no variant in study {study.study_name}; see `report`")


def render(args) -> int:
    """Write the engine file of a trial (default: the study's verified best, else its best
    correct trial)."""
    from search.study import load_records, locate_study  # (Optuna)

    study, _ = locate_study(args.storage, args.study, args.studies_dir)
    record = _pick(study, load_records(study), args.trial)
    variant = Variant.from_dict(record.variant)
    header = f"variant {variant.name} from study {study.study_name}, trial {record.number}"
    budget = study.user_attrs.get("memory_budget_gib")
    engine_budget = None if budget is None else budget / ENGINES_ALIVE
    path = load_renderer(args.renderer)(variant, Path(args.output), header, engine_budget)
    print(f"wrote {path or args.output}: trial {record.number} {variant.name}")
    print(json.dumps(variant.to_dict(), sort_keys=True))
    return 0
