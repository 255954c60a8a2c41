"""Choosing and writing the engine: the candidates in order (ranked trials, then defaults never
shown wrong), the leaders re-measured like the grader, and the first candidate that passes the
evaluator's checks in a fresh process moved over `workspace/engine.py` (an atomic rename: the
file in place is always a verified engine); the verified best remembered in the study."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from search.setup import (
    ENGINES_ALIVE,
    REMEASURE_TRIALS,
    WRAP_UP_S,
    device_kind,
)
from search.trial import Record, run_child, tail
from variants.presets import ranked_defaults
from variants.variant import Variant

log = logging.getLogger(__name__)

# Throughputs within 1 % are a tie (run-to-run noise is of that order); among tied trials the
# smaller peak wins, where it is smaller by more than MEMORY_TIE: peaks closer than that (block
# sizes, graph pools) are a tie too, and the faster of them wins.
TIE = 0.01
MEMORY_TIE = 0.05


def _order(records: list[Record]) -> list[Record]:
    remaining = sorted(records, key=lambda r: (-r.tokens_per_s, r.number))
    ordered = []
    while remaining:
        top = remaining[0].tokens_per_s
        ties = [r for r in remaining if r.tokens_per_s >= top * (1 - TIE)]
        least = min(r.peak_mib for r in ties)
        lean = [r for r in ties if r.peak_mib <= least * (1 + MEMORY_TIE)]
        pick = min(lean, key=lambda r: (-r.tokens_per_s, r.peak_mib, r.number))
        ordered.append(pick)
        remaining.remove(pick)
    return ordered


def first_ranked(records: list[Record]) -> Record:
    """The one of `records` the ranking puts first (by their throughput, ties as above)."""
    return _order(list(records))[0]


def rank(records: list[Record]) -> list[Record]:
    """Feasible trials, one per variant, best first: those re-measured with the full protocol
    (by their full numbers), then the others (by the screening numbers)."""
    seen, unique = set(), []
    for r in sorted(records, key=lambda r: r.number):
        key = repr(sorted((r.variant or {}).items()))
        if r.feasible and r.attrs.get("full_status") != "failed" and key not in seen:
            seen.add(key)
            unique.append(r)
    return _order([r for r in unique if r.has_full]) + _order([r for r in unique if not r.has_full])


@dataclass
class Verification:
    passed: bool
    output: str
    seconds: float
    steps: list[str] = field(default_factory=list)


COLD_PASS_NOTE = (
    "  (one pass with no warm-up, its first calls' one-time costs included: it shows that the\n"
    "  engine runs the grader's traces; the trials above are the measurements.)"
)
COMPILE_NOTE = (
    "  (the first case's seconds include compiling the engine file's Triton kernels that\n"
    "  Triton's cache does not hold from this engine's trial.)"
)


def verify_engine(
    engine: Path,
    config_path,
    weight_dir,
    device,
    timeout_s: float,
    benchmark: bool = True,
    gate: str = "course",
    stress_positions: int | None = None,
) -> Verification:
    """The evaluator's correctness CLI (public + stress under `gate`, the stress case's longest
    request at `stress_positions`) and, with `benchmark`, one pass of the public traces, each in
    a fresh process."""
    common = ["--engine", str(engine), "--model-config", str(config_path)]
    common += ["--weight-dir", str(weight_dir), "--device", device]
    check = [*common, "--stress", "--gate", gate]
    if stress_positions is not None:
        check += ["--stress-positions", str(stress_positions)]
    commands = [("evaluator/test_correctness.py", check)]
    if benchmark:
        once = [*common, "--warmup", "0", "--repeat", "1"]
        commands.append(("evaluator/benchmark_throughput.py", once))
    start = time.perf_counter()
    outputs, steps = [], []
    for script, options in commands:
        json_path = engine.parent / "verify.json"
        json_path.unlink(missing_ok=True)
        log_path = engine.parent / "verify.log"
        cmd = [sys.executable, script, *options, "--json", str(json_path)]
        code, seconds = run_child(cmd, log_path, timeout_s)
        shown = " ".join([script, *options]).replace(str(engine), "engine.py")
        outputs.append(f"$ python {shown}\n{_digest(json_path) or tail(log_path, 3000)}")
        if script.endswith("benchmark_throughput.py") and code == 0:
            outputs.append(COLD_PASS_NOTE)
        if script.endswith("test_correctness.py") and "@triton.jit" in engine.read_text():
            outputs.append(COMPILE_NOTE)
        status = "timed out" if code is None else f"exit {code}"
        steps.append(f"{Path(script).name}: {status} ({seconds:.1f} s)")
        if code != 0:
            if json_path.is_file():
                outputs.append(tail(log_path, 1500))
            return Verification(False, "\n".join(outputs), time.perf_counter() - start, steps)
    return Verification(True, "\n".join(outputs), time.perf_counter() - start, steps)


def _digest(json_path: Path) -> str | None:
    """One line per correctness case or benchmark trace of an evaluator JSON report."""
    try:
        report = json.loads(json_path.read_text())
    except (OSError, ValueError):
        return None
    lines = []
    for case, c in report.get("cases", {}).items():
        verdict = "passed" if c["passed"] else f"FAILED: {c['failure']}"
        noise = c.get("noise_share")
        lines.append(
            f"  {case}: {verdict} ({c.get('gate', 'course')} gate); max |err| "
            f"{c['max_abs_err']:.3g}, tol share {c['tol_share']:.3f}, noise share "
            f"{'-' if noise is None else f'{noise:.3f}'}, {c['steps']} steps, "
            f"{c.get('seconds', 0):.1f} s"
        )
    for name, t in report.get("traces", {}).items():
        eff = t.get("floor_efficiency")
        lines.append(
            f"  {name}: {t['tokens_per_s']:.1f} tok/s, "
            f"{t['decode_tokens_per_s']:.1f} decode tok/s, "
            f"floor eff {'-' if eff is None else f'{eff:.4f}'}, "
            f"peak {t['peak_mib']:.0f} MiB, create {t['create_s']:.2f} s"
        )
    return "\n".join(lines) or None


@dataclass
class Attempt:
    record: Record
    verification: Verification | None
    error: str | None = None


def write_verified(candidates, render, workspace: Path, verify, header) -> list[Attempt]:
    """Render, verify and install the first candidate that passes: the last attempt, if any."""
    staging = workspace / "verify.tmp"
    staging.mkdir(parents=True, exist_ok=True)
    attempts = []
    try:
        for record in candidates:
            path = staging / "engine.py"
            try:
                render(Variant.from_dict(record.variant), path, header(record))
            except Exception as exc:
                log.warning("rendering %s failed: %r", record.name, exc)
                attempts.append(Attempt(record, None, f"render failed: {exc!r}"))
                continue
            result = verify(path)
            attempts.append(Attempt(record, result))
            log.info(
                "verification of %s: %s (%s)",
                record.name,
                "passed" if result.passed else "FAILED",
                "; ".join(result.steps),
            )
            if result.passed:
                os.replace(path, workspace / "engine.py")
                return attempts
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return attempts


def installed(attempts: list[Attempt]) -> Attempt | None:
    last = attempts[-1] if attempts else None
    return last if last and last.verification and last.verification.passed else None


def remeasure(job, records: list[Record]) -> None:
    """The `--remeasure` leaders timed with the grader's full protocol in the time the steps
    after it leave (the budget keeps the first one's: the written engine's figures are the
    grader's protocol's); their `full_*` numbers go into the records and the study."""
    leaders, kind = rank(records)[: job.args.remeasure], device_kind(job.device)
    measured: dict[int, dict] = {}
    after = after_remeasure_s(job)
    for record in leaders:
        if record.has_full:
            continue
        # no gate, but a fresh engine per repeat: a few screening trials
        expected = REMEASURE_TRIALS[kind] * (record.attrs.get("trial_seconds") or 30.0)
        # the first comes before a CPU's sweep (which takes what is left), with half its time
        first = not measured
        after = after_remeasure_s(job, sweep=not (first and kind == "cpu"))
        if job.seconds_left() - after < (0.5 if first else 1.0) * expected:
            log.info("no time left to re-measure trial %d with the full protocol", record.number)
            break
        # a run slower than expected (a loaded machine) may take what the later steps leave
        limit = min(job.runner.timeout_s, max(expected, job.seconds_left() - after))
        outcome = job.runner.run(
            Variant.from_dict(record.variant), protocol="full", check=False, timeout_s=limit
        )
        if outcome.attrs.get("timed_out") and limit < job.runner.timeout_s:
            log.info("trial %d full protocol: cut short by the budget", record.number)
            break  # no verdict on the variant (a trial may take longer): its screening stands
        if outcome.status == "ok":
            full = {k: v for k, v in outcome.attrs.items() if k.startswith("full_")}
            full["full_status"] = "ok"
        else:
            full = {"full_status": "failed", "full_reason": outcome.reason}
        log.info(
            "trial %d full protocol: %s",
            record.number,
            f"{full['full_tokens_per_s']:.1f} tokens/s" if "full_tokens_per_s" in full else full,
        )
        measured[record.number] = full
    left = [r for r in leaders if not r.has_full and r.number not in measured]
    if left:
        job.notes.append(
            f"full-protocol re-measure: {len(left)} leader(s) keep their screening numbers; the "
            f"verification and the shape sweep need the budget's last {after:.0f} s"
        )
    for r in records:
        r.attrs.update(measured.get(r.number, {}))
    if measured and job.study is not None:
        stored = job.study.user_attrs.get("full_protocol", {})
        job.study.set_user_attr(
            "full_protocol", {**stored, **{str(n): a for n, a in measured.items()}}
        )


def after_remeasure_s(job, kernels: bool = True, sweep: bool = True) -> float:
    """What the steps after the re-measurement need at the least: the verification (the
    budget's estimate), with `sweep` the shape sweep (the budget's estimate), the wrap-up and, with
    `kernels`, the kernel search and its leader's timings."""
    durations = job.runner.durations
    need = job.budget.verify_estimate_s(durations) + WRAP_UP_S
    need += job.budget.sweep_estimate_s(durations) if sweep else 0.0
    if kernels and getattr(job, "kernel_search_s", 0.0):
        need += job.budget.kept_reserve_s(durations)
    return need


def candidates(job, records: list[Record], ranked: list[Record]) -> list[Record]:
    """Ranked trials within the memory budget, then defaults never shown wrong (so some engine
    is always written). A trial screened on one engine and never timed in the grader's pattern
    is kept only where three of its engines fit the budget."""
    tried = {repr(sorted(r.variant.items())) for r in records if r.variant and _ruled_out(r)}
    tried |= {repr(sorted(r.variant.items())) for r in ranked}
    budget = job.runner.memory_budget_mib
    ranked = [
        r
        for r in ranked
        if budget is None
        or r.has_full
        or r.attrs.get("grader_peak_mib") is not None
        or ENGINES_ALIVE * r.peak_mib <= budget
    ]
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
        "(course: a course-layout model.pt only; safetensors: one safetensors file; any: "
        "every format)",
        f"{FINGERPRINT}{model_fingerprint(target)}",
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


FINGERPRINT = "model fingerprint: "  # a header line: the weights and config it was verified on


def model_fingerprint(target) -> str:
    """The weights' fingerprint and the config's: an engine verified on one model's weights
    under another config is not this model's."""
    config = hashlib.blake2b(json.dumps(target.config, sort_keys=True).encode(), digest_size=5)
    return f"{target.fingerprint}-c{config.hexdigest()}"


def engine_fingerprint(path: Path) -> str | None:
    """The model fingerprint in an engine file's header (None: none there)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for line in reversed(text.splitlines()):
        if line.startswith("# " + FINGERPRINT):
            return line[len("# " + FINGERPRINT) :].strip()
    return None


def set_aside(job) -> str:
    """After a run that wrote nothing: an engine.py verified on this model (its weights and
    config) stays, any other moves to engine.stale.py; says which."""
    engine = job.workspace / "engine.py"
    if not engine.is_file():
        return "no engine.py is in place"
    if engine_fingerprint(engine) == model_fingerprint(job.target):
        return f"the earlier {engine} (verified on this model's weights and config) stays in place"
    stale = engine.with_name("engine.stale.py")
    engine.replace(stale)
    return f"the earlier {engine}, not verified on this model, moved to {stale.name}"


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


def remember(job, record: Record) -> None:
    if job.study is None:
        return
    from search.study import started_trials  # (Optuna: imported where a study is open)

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
