"""Choosing and writing for the main job: the leaders re-measured with the full protocol, the
candidates in order (ranked trials, then defaults never shown wrong), the engine file's header,
verification in a fresh process, and the verified best remembered in the study.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from pathlib import Path

from search.records import Record
from search.select import rank, remeasure_leaders, verify_engine
from variants.presets import ranked_defaults


def remeasure(job, records: list[Record]) -> None:
    """The leaders with the full protocol, in the time that the steps after it leave."""
    after = after_remeasure_s(job)
    measured = remeasure_leaders(
        records, job.runner, job.args.remeasure, lambda: job.seconds_left() - after
    )
    left = [
        r
        for r in rank(records)[: job.args.remeasure]
        if not r.has_full and r.number not in measured
    ]
    if left:
        job.notes.append(
            f"full-protocol re-measure: {len(left)} leader(s) keep their screening numbers; the "
            f"verification and the shape sweep need the budget's last {after:.0f} s"
        )
    for r in records:
        r.attrs.update(measured.get(r.number, {}))
    if measured and job.study is not None:
        from search.study import update_study_attr

        update_study_attr(job.study, "full_protocol", {str(n): a for n, a in measured.items()})


def after_remeasure_s(job) -> float:
    """What the steps after the re-measurement need at the least: the verification, about one
    typical trial (about 20 s on an H200), and the shape sweep at its least. Without this
    reserve a short study overruns its budget."""
    from search.sweep_leaders import least_sweep_s

    typical = 20.0  # no trial yet: Budget's first guess (optimize.py imports Optuna; not here)
    if job.runner.durations:
        typical = statistics.median(job.runner.durations)
    return typical + least_sweep_s("cuda" if job.device.startswith("cuda") else "cpu")


def candidates(job, records: list[Record], ranked: list[Record]) -> list[Record]:
    """Ranked trials, then defaults never shown wrong (so some engine is always written)."""
    tried = {repr(sorted(r.variant.items())) for r in records if r.variant and _ruled_out(r)}
    tried |= {repr(sorted(r.variant.items())) for r in ranked}
    extra = []
    for i, v in enumerate(ranked_defaults(job.caps)):
        v = job.space.canonical(v)
        if repr(sorted(v.to_dict().items())) not in tried:
            attrs = {"variant_name": v.name, "source": "ranked default, not measured"}
            extra.append(Record(-1 - i, "fallback", v.to_dict(), attrs))
    return ranked + extra


def header(job, record: Record) -> str:
    target = job.target
    lines = [
        "Written by `bash run.sh` (python -m search run), " + time.strftime("%Y-%m-%d %H:%M:%S"),
        f"model: {target.config_path}",
        f"weights: {target.weights_file}, read as {target.weights_format} "
        "(course: a course-layout model.pt only; any: every format)",
        f"{FINGERPRINT}{target.fingerprint}",
        f"variant: {record.name}",
    ]
    if job.study_name:
        lines.append(f"study: {job.study_name} ({job.storage_url})")
    if record.number >= 0:
        where = f"study {job.study_name}, " if job.study_name else ""
        lines.append(
            f"{where}trial {record.number}: {record.tokens_per_s:.1f} tokens/s (geometric "
            f"mean of {', '.join(job.runner.traces)}), peak {record.peak_mib:.0f} MiB"
        )
    return "\n".join(lines)


FINGERPRINT = "weights fingerprint: "  # a header line: which weights the engine was verified on


def engine_fingerprint(path: Path) -> str | None:
    """The weights fingerprint in an engine file's header (None: none there)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for line in reversed(text.splitlines()):
        if line.startswith("# " + FINGERPRINT):
            return line[len("# " + FINGERPRINT) :].strip()
    return None


def set_aside(job) -> str:
    """After a run that wrote nothing: an engine.py left by a run on these weights stays (it
    was verified on them); any other moves to engine.stale.py. Says which."""
    engine = job.workspace / "engine.py"
    if not engine.is_file():
        return "no engine.py is in place"
    if engine_fingerprint(engine) == job.target.fingerprint:
        return f"the earlier {engine} (verified on these weights) stays in place"
    stale = engine.with_name("engine.stale.py")
    engine.replace(stale)
    return f"the earlier {engine}, not verified on these weights, moved to {stale.name}"


def common_failure(records: list[Record], attempts) -> str:
    """The most frequent first line of the trials' and verifications' failure reasons."""
    reasons = [
        (r.attrs.get("reason") or "").strip().splitlines()[0]
        for r in records
        if r.status in ("failed", "infeasible") and (r.attrs.get("reason") or "").strip()
    ]
    for a in attempts:
        if a.verification is not None and not a.verification.passed:
            reasons.append(a.verification.steps[-1] if a.verification.steps else "verification")
        elif a.error:
            reasons.append(a.error)
    if not reasons:
        return "no trial ran"
    reason = max(set(reasons), key=reasons.count)
    return f"{reason} ({reasons.count(reason)} of {len(reasons)})"


def verify(job, benchmark: bool):
    def run(path: Path):
        return verify_engine(
            path,
            job.target.config_path,
            job.target.weight_dir,
            job.device,
            timeout_s=job.verify_timeout,
            benchmark=benchmark,
            gate=job.gate,
            stress_positions=job.stress_positions,
        )

    return run


def remember(job, record: Record) -> None:
    if job.study is None:
        return
    from search.study import started_trials

    digest = hashlib.sha256((job.workspace / "engine.py").read_bytes()).hexdigest()
    job.study.set_user_attr(
        "verified_best",
        {
            "trial": record.number,
            "variant": record.variant,
            "variant_name": record.name,
            "tokens_per_s": record.tokens_per_s,
            "peak_mib": record.peak_mib,
            "n_trials": len(started_trials(job.study)),
            "engine_sha256": digest,
            "verified_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
    )


def _ruled_out(record: Record) -> bool:
    """Shown wrong, or crashed for a reason other than running out of time."""
    return record.status == "infeasible" or (
        record.status == "failed" and not record.attrs.get("timed_out")
    )
