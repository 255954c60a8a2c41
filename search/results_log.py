"""`workspace/results.log`: what was searched, what every trial did, what won and why.

Plain text for people; the study storage is the data (open it with the dashboard command at the
end of the log).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from search.records import Record
from search.report import failure_details, top_table, trace_table, trial_line
from search.select import Attempt, installed


@dataclass
class RunSummary:
    command: str
    environment: dict
    target: dict  # config path, weight dir, the config itself, notes
    capabilities: dict
    space: list[tuple[str, tuple]]
    space_size: int
    records: list[Record]
    ranked: list[Record]
    attempts: list[Attempt]
    phases: dict[str, float]
    storage: str | None = None
    study: str | None = None
    dashboard: str | None = None
    notes: list[str] = field(default_factory=list)


def _section(title: str, body: str) -> str:
    return f"== {title} ==\n{body.rstrip()}\n"


RANKING = (
    "Ranking: correct trials only (within half the tolerance), one per assembly; the leaders "
    "re-measured with the grader's full protocol first, by those numbers, then the others by "
    "their screening numbers; within 1 % the smaller peak memory first. The first that passes "
    "verification is written."
)


def _compare(chosen: Record, other: Record) -> tuple[float, float, str]:
    """Both trials' throughput from one protocol: the full one when both have it."""
    if chosen.has_full and other.has_full:
        return chosen.tokens_per_s, other.tokens_per_s, "full protocol"
    return chosen.screening_tokens_per_s, other.screening_tokens_per_s, "screening"


def _why(chosen: Record, ranked: list[Record]) -> str:
    if chosen.number < 0:
        return (
            f"{chosen.name}: a ranked default that was not measured here; no measured trial "
            "passed verification, so the safest default that passes it was written."
        )
    protocol = "full protocol" if chosen.has_full else "screening"
    text = (
        f"{chosen.name} (trial {chosen.number}): {chosen.tokens_per_s:.1f} tokens/s "
        f"(geometric mean, {protocol}), peak {chosen.peak_mib:.0f} MiB, "
        f"max error {chosen.attrs.get('max_abs_err', float('nan')):.3g} "
        f"({chosen.attrs.get('tol_share', float('nan')):.2f} of the tolerance)."
    )
    others = [r for r in ranked if r.number != chosen.number]
    if not others:
        return text + "\nIt was the only correct candidate.\n" + RANKING
    up = others[0]
    mine, theirs, protocol = _compare(chosen, up)
    ratio = mine / theirs if theirs else float("inf")
    text += (
        f"\nRunner-up: {up.name} (trial {up.number}): {theirs:.1f} against {mine:.1f} tokens/s "
        f"({protocol}, both), peak {up.peak_mib:.0f} MiB: the chosen one is {ratio:.3f}x its "
        "throughput"
    )
    if abs(ratio - 1) < 0.01:
        text += " (a tie within 1 %: the smaller peak memory decided)"
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


def render_log(s: RunSummary) -> str:
    out = [f"# results of: {s.command}\n"]
    out.append(_section("environment", "\n".join(f"{k}: {v}" for k, v in s.environment.items())))
    target = dict(s.target)
    config = target.pop("config", {})
    body = "\n".join(f"{k}: {v}" for k, v in target.items())
    out.append(_section("target", body + "\nconfig: " + json.dumps(config, sort_keys=True)))
    space = "\n".join(f"{name}: {', '.join(str(c) for c in choices)}" for name, choices in s.space)
    space += f"\n({s.space_size} assemblies; capabilities: {json.dumps(s.capabilities)})"
    out.append(_section("search space (axes and the choices offered here)", space))
    if s.notes:
        out.append(_section("notes", "\n".join(s.notes)))
    trials = "\n".join(trial_line(r) for r in sorted(s.records, key=lambda r: r.number))
    out.append(_section(f"trials ({len(s.records)})", trials or "(none)"))
    out.append(_section("top 5", top_table(s.ranked, 5)))
    done = installed(s.attempts)
    if done is not None:
        chosen = done.record
        body = _why(chosen, s.ranked) + "\nvariant: " + json.dumps(chosen.variant, sort_keys=True)
        body += "\n\n" + trace_table(chosen)
        out.append(_section("chosen", body))
    else:
        out.append(
            _section("chosen", "NONE: no candidate passed verification; engine.py untouched")
        )
    out.append(_section("verification", _verification(s.attempts)))
    phases = "\n".join(f"{name}: {secs:.1f} s" for name, secs in s.phases.items())
    out.append(_section("time per phase", phases))
    if s.storage:
        where = f"storage: {s.storage}\nstudy: {s.study}"
        out.append(_section("study", f"{where}\ndashboard: {s.dashboard}"))
    out.append(_section("failure details", failure_details(s.records)))
    return "\n".join(out)


def write_log(path: Path, summary: RunSummary) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render_log(summary))
    os.replace(tmp, path)
