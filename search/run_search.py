"""The search phase of the main job: the Optuna study (resumed, its model recorded, known-good
assemblies first, their Triton kernels compiled side by side on a GPU, then the sampler inside
the budget) or, without Optuna, the ranked defaults alone. A study whose verified best still
stands is not searched again.
"""

from __future__ import annotations

import logging
from pathlib import Path

from search.errors import UserError
from search.records import Record
from search.run_setup import measure_ceilings
from variants.presets import ranked_defaults
from variants.variant import Variant

log = logging.getLogger("search.pipeline")  # the main job's log lines carry one name


def sweep_s(job) -> float:
    """What the shape sweep after the search may take at most (its engines' builds aside)."""
    from search.sweep_leaders import PIPELINE_LIMIT_S

    return PIPELINE_LIMIT_S["cuda" if job.device.startswith("cuda") else "cpu"]


def optuna_available() -> bool:
    try:
        import optuna  # noqa: F401
    except ImportError:
        return False
    return True


def search_trials(job) -> tuple[list[Record], Record | None]:
    """The study (or the defaults alone); if the machinery itself breaks, whatever trials
    finished, so that an engine is still verified and written."""
    try:
        if job.args.no_optuna or not optuna_available():
            why = "--no-optuna" if job.args.no_optuna else "Optuna cannot be imported"
            job.notes.append(f"{why}: evaluated the ranked default candidates only")
            log.warning("%s: evaluating the ranked default candidates only", why)
            return search_defaults(job), None
        return search_with_optuna(job)
    except UserError:  # the storage, the study or the model is wrong: say so, write nothing
        raise
    except Exception as exc:
        log.exception("the search failed; writing the best verified candidate found so far")
        job.notes.append(f"the search failed ({exc!r}); candidates: the trials so far")
        try:
            from search.study import load_records

            return (load_records(job.study) if job.study is not None else []), None
        except Exception:
            return [], None


def search_with_optuna(job) -> tuple[list[Record], Record | None]:
    """Records of the study, and the verified best when it stands (no search was needed)."""
    from search import study as st
    from search.optimize import Budget, enqueue_known_good, optimize
    from search.warm_kernels import warm_queued

    args = job.args
    target = job.target
    name = args.study or st.study_name(target.config, job.caps, target.fingerprint, job.gate)
    url = args.storage or st.default_storage_url(name, args.studies_dir)
    job.storage_url, job.study_name, job.dashboard = url, name, st.dashboard_command(url)
    storage = st.open_storage(url, heartbeat_s=args.heartbeat)
    study = job.study = st.open_study(storage, name, fresh=args.fresh, seed=args.seed)
    check_same_model(job, study)
    if args.storage is None:
        st.remember_last_run(args.studies_dir, url, name)
    st.fail_stale_trials(study, older_than_s=2 * job.trial_timeout + 120)
    records = st.load_records(study)
    best = standing_best(job, study, records)
    if best is not None:
        job.notes.append(
            f"resumed study {name}: its verified best (trial {best.number}) stands; "
            "no new trials were run, the best was re-rendered and re-verified"
        )
        return records, best
    job.runner.ceilings = study.user_attrs.get("ceilings") or measure_ceilings(job.device)
    prepare_study(job, study)
    hardware = st.hardware_key(job.caps)
    studies_dir = Path(args.studies_dir) if args.storage is None else None
    queued = enqueue_known_good(study, job.space, job.caps, storage, name, hardware, studies_dir)
    if queued:
        job.notes.append("enqueued first: " + "; ".join(queued))
    elif records:
        job.notes.append(f"resumed study {name} with {len(records)} earlier trial(s)")
    job.runner.durations += [
        r.attrs["trial_seconds"]
        for r in records
        if r.status in ("ok", "infeasible") and r.attrs.get("trial_seconds")
    ]
    warmed = warm_queued(job, study)
    if warmed:
        job.notes.append(warmed)
    budget = Budget(job.deadline, job.trial_timeout, total_s=job.budget_s, after_s=sweep_s(job))
    optimize(study, job.space, job.runner, budget, n_trials=args.trials)
    return st.load_records(study), None


def check_same_model(job, study) -> None:
    """A study resumes only over the weights and gate it measured (its name says so unless
    --study named it)."""
    from search.errors import UserError

    for key, now in (("weights_fingerprint", job.target.fingerprint), ("gate", job.gate)):
        then = study.user_attrs.get(key)
        if then is not None and then != now:
            raise UserError(
                f"study {study.study_name} measured another {key.replace('_', ' ')} ({then}; "
                f"this run: {now}): pass --fresh to start it over, or another --study"
            )


def prepare_study(job, study) -> None:
    from search.study import hardware_key

    attrs = {
        "weights_fingerprint": job.target.fingerprint,
        "weights_file": job.target.weights_file,
        "gate": job.gate,
        "model_config": job.target.config,
        "model_config_path": str(job.target.config_path),
        "weight_dir": str(job.target.weight_dir),
        "hardware": hardware_key(job.caps),
        "capabilities": job.caps.to_dict(),
        "space": {name: list(choices) for name, choices in job.space.describe()},
        "traces": list(job.runner.traces),
        "objectives": "maximize geometric-mean tokens/s over the traces; minimize peak MiB",
        "ceilings": job.runner.ceilings,
        "memory_budget_gib": job.memory_budget_gib,
    }
    for key, value in attrs.items():
        if study.user_attrs.get(key) != value:
            study.set_user_attr(key, value)


def standing_best(job, study, records: list[Record]) -> Record | None:
    from search.study import started_trials

    best = study.user_attrs.get("verified_best")
    if not best or best["trial"] < 0 or job.args.fresh:
        return None  # none, or an unmeasured default written when every trial failed
    started = len(started_trials(study))
    if best.get("n_trials") != started or (job.args.trials or 0) > started:
        return None  # newer trials (other workers), or more trials asked for
    variant = Variant.from_dict(best["variant"])
    if job.caps.why_invalid(variant) is not None:
        return None
    for r in records:
        if r.number == best["trial"]:
            return r
    return Record(best["trial"], "ok", best["variant"], {"variant_name": variant.name})


def search_defaults(job) -> list[Record]:
    """No Optuna: the ranked defaults, each in its own process, inside the budget."""
    from search.optimize import Budget
    from search.warm_kernels import warm_first

    job.runner.ceilings = measure_ceilings(job.device)
    budget = Budget(job.deadline, job.trial_timeout, total_s=job.budget_s, after_s=sweep_s(job))
    defaults = ranked_defaults(job.caps)[: job.args.trials or None]
    defaults = [job.space.canonical(v) for v in defaults]
    warmed = warm_first(job, defaults)
    if warmed:
        job.notes.append(warmed)
    records = []
    for number, variant in enumerate(defaults):
        limit = budget.time_for_trial(job.runner.durations)
        if limit is None:
            break
        outcome = job.runner.run(variant, timeout_s=limit)
        log.info("default %d %s: %s", number, variant.name, outcome.status)
        records.append(
            Record(number, outcome.status, variant.to_dict(), outcome.attrs, outcome.values)
        )
    return records
