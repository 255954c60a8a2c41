"""The ask-and-tell loop: known-good assemblies first, then the sampler, inside a time budget.

Each trial runs in a child process (`search.trial`); its numbers become user attributes, its
correctness margin the constraint. A variant seen before is not run again: the trial copies the
earlier result. Several processes may run this loop on one storage; a trial target is then shared
(a trial asked for after the target was reached is marked "skipped" and not run).
"""

from __future__ import annotations

import logging
import statistics
import time
import warnings
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from search.study import (
    earlier_best_variants,
    fail_stale_trials,
    heartbeat,
    set_constraint,
    started_trials,
)
from variants.presets import PRESETS
from variants.variant import Variant

log = logging.getLogger(__name__)


def enqueue_known_good(study, space, caps, storage, name, hardware, studies_dir) -> list[str]:
    """Enqueue the ranked defaults and earlier verified bests on this hardware (once per study)."""
    if study.get_trials(deepcopy=False):
        return []
    candidates = [(f"preset:{key}", v) for key, v in PRESETS.items()]
    for other, values in earlier_best_variants(storage, name, hardware, studies_dir):
        candidates.insert(0, (f"best of {other}", Variant.from_dict(values)))
    seen, queued = set(), []
    for source, variant in candidates:
        if caps.why_invalid(variant) is not None:
            continue
        variant = space.canonical(variant)
        if variant in seen:
            continue
        seen.add(variant)
        attrs = {"source": source, "variant": variant.to_dict(), "variant_name": variant.name}
        study.enqueue_trial(space.params_for(variant), user_attrs=attrs)
        queued.append(f"{source} ({variant.name})")
    log.info("enqueued %d known-good assemblies: %s", len(queued), "; ".join(queued))
    return queued


@dataclass
class Budget:
    """Wall-clock deadline for the loop and what must stay in reserve after it: the full-protocol
    re-measurement of three leaders (about one trial each on an H200) and the final verification
    (a third of a trial there), in typical trials, plus `after_s` (the shape sweep's limit),
    never more than `max_reserve_share` of the whole budget."""

    deadline: float  # time.monotonic() value
    trial_timeout_s: float
    total_s: float = 0.0
    reserve_trials: float = 4.0
    max_reserve_share: float = 0.35
    first_guess_s: float = 20.0
    after_s: float = 0.0

    def typical_trial_s(self, durations: list[float]) -> float:
        return statistics.median(durations) if durations else self.first_guess_s

    def time_for_trial(self, durations: list[float]) -> float | None:
        """Seconds the next trial may take, or None when the budget is spent."""
        typical = self.typical_trial_s(durations)
        wanted = self.reserve_trials * typical + self.after_s
        reserve = min(wanted, self.max_reserve_share * self.total_s)
        left = self.deadline - time.monotonic() - reserve
        if left < 0.75 * typical:
            return None
        return min(self.trial_timeout_s, left)


def find_duplicate(study, variant: Variant):
    """An earlier finished trial of the same variant whose result still stands."""
    values = variant.to_dict()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        attrs = trial.user_attrs
        if attrs.get("variant") != values or attrs.get("status") in ("skipped", None):
            continue
        if trial.state == TrialState.FAIL and attrs.get("timed_out"):
            continue  # a timeout may have been a short budget, not the variant
        return trial
    return None


def copy_result(study, trial, earlier) -> str:
    for key, value in earlier.user_attrs.items():
        if key not in ("source", "status"):
            trial.set_user_attr(key, value)
    trial.set_user_attr("duplicate_of", earlier.number)
    if earlier.state == TrialState.FAIL:
        trial.set_user_attr("status", "failed")
        study.tell(trial, state=TrialState.FAIL)
        return "failed"
    status = "duplicate" if earlier.user_attrs.get("status") == "ok" else "infeasible"
    trial.set_user_attr("status", status)
    set_constraint(trial, earlier.user_attrs.get("constraint", [1.0])[0])
    study.tell(trial, values=earlier.values)
    return status


def tell_outcome(study, trial, outcome) -> None:
    for key, value in outcome.attrs.items():
        if key != "constraint":
            trial.set_user_attr(key, value)
    set_constraint(trial, outcome.constraint)
    if outcome.status == "failed":
        study.tell(trial, state=TrialState.FAIL)
    else:
        study.tell(trial, values=list(outcome.values))


def _over_target(study, trial, n_trials: int | None) -> bool:
    if n_trials is None:
        return False
    earlier = [t for t in started_trials(study) if t.number < trial.number]
    return len(earlier) >= n_trials


def _progress(total, initial):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(
        total=total, initial=initial, desc="trials", unit="trial", dynamic_ncols=True, disable=None
    )


def optimize(study, space, runner, budget: Budget, n_trials: int | None = None) -> int:
    """Run trials until `n_trials` have started in the study or the budget is spent; returns
    how many this process ran (duplicates included)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    done = 0
    bar = _progress(n_trials, len(started_trials(study)))
    try:
        while n_trials is None or len(started_trials(study)) < n_trials:
            limit = budget.time_for_trial(runner.durations)
            if limit is None:
                log.info("search budget spent after %d trial(s) in this process", done)
                break
            fail_stale_trials(study, older_than_s=2 * budget.trial_timeout_s + 120)
            with warnings.catch_warnings():
                # Optuna would beat only inside study.optimize; `heartbeat` does it here.
                warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used")
                trial = study.ask()
            with heartbeat(study, trial):
                if _over_target(study, trial, n_trials):
                    trial.set_user_attr("status", "skipped")
                    trial.set_user_attr("reason", "the study reached its trial target meanwhile")
                    study.tell(trial, state=TrialState.FAIL)
                    break
                variant, summary = _run_one(study, space, runner, trial, limit)
            done += 1
            log.info("trial %d %s: %s", trial.number, variant.name, summary)
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(summary[:60])
    finally:
        if bar is not None:
            bar.close()
    return done


def _run_one(study, space, runner, trial, limit: float) -> tuple[Variant, str]:
    """Run (or copy) the trial's variant and tell the study: the variant, a one-line summary."""
    variant = space.suggest(trial)
    earlier = find_duplicate(study, variant)
    if earlier is not None:
        status = copy_result(study, trial, earlier)
        return variant, f"same as trial {earlier.number}: {status}"
    try:
        outcome = runner.run(variant, timeout_s=limit)
    except Exception as exc:  # the runner itself broke: record it, stop cleanly
        trial.set_user_attr("status", "failed")
        trial.set_user_attr("reason", f"trial runner error: {exc!r}")
        study.tell(trial, state=TrialState.FAIL)
        raise
    tell_outcome(study, trial, outcome)
    return variant, _summary(outcome)


def _summary(outcome) -> str:
    if outcome.status == "ok":
        return f"{outcome.values[0]:.1f} tokens/s, {outcome.values[1]:.0f} MiB"
    reason = (outcome.reason or "").strip().splitlines()
    return f"{outcome.status}: {reason[0] if reason else '?'}"
