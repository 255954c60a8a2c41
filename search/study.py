"""The study and the search in it: its name, storage and sampler, and the ask-and-tell loop.
The storage URL is the single source of truth (trials, the model the study tunes, the verified
best), so a run resumes and workers share one study; the default `studies/<name>.db` is named
after the model, weights, gate and machine. A variant seen before copies the earlier result."""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import threading
import time
import warnings
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState
from tqdm import tqdm

from search.setup import COSTLY, Budget
from search.trial import NEAREST, PRUNE_SHARE, Record
from variants.presets import PRESETS
from variants.probe import UserError
from variants.variant import Variant

log = logging.getLogger(__name__)

# a model's shape, hashed into its study's name
SHAPE_KEYS = (
    "vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads "
    "num_key_value_heads head_dim max_position_embeddings rms_norm_eps rope_theta torch_dtype"
).split()
DIRECTIONS = ("maximize", "minimize")
METRIC_NAMES = ("tokens_per_s", "peak_mib")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def config_hash(config: dict) -> str:
    shape = {k: config.get(k) for k in SHAPE_KEYS}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:10]


def hardware_key(caps) -> str:
    import torch

    where = _slug(caps.gpu_name) if caps.gpu_name else "cpu"
    return f"{where}-torch{torch.__version__.split('+')[0]}"


def study_name(config: dict, caps, fingerprint: str = "", gate: str = "") -> str:
    """model type, config shape hash, weights fingerprint, gate, GPU (or cpu) and torch: a
    study resumes only over the same model, weights, gate and machine."""
    model = _slug(str(config.get("model_type", "model"))) or "model"
    parts = [model, config_hash(config)]
    parts += [f"w{fingerprint[:6]}"] if fingerprint else []
    parts += [gate] if gate else []
    return "-".join([*parts, hardware_key(caps)])


def model_attrs(target, gate: str, caps) -> dict:
    """The study attributes that say what it measures: model, weights, gate and machine."""
    return {
        "model_config": target.config,
        "model_config_path": str(target.config_path),
        "weight_dir": str(target.weight_dir),
        "weights_fingerprint": target.fingerprint,
        "gate": gate,
        "hardware": hardware_key(caps),
    }


def default_storage_url(name: str, studies_dir: str | Path = "studies") -> str:
    Path(studies_dir).mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{Path(studies_dir) / name}.db"


LAST_RUN = "last_run.json"  # in the studies folder: the study the last `run` wrote


def remember_last_run(studies_dir: str | Path, url: str, name: str) -> None:
    path = Path(studies_dir) / LAST_RUN
    path.parent.mkdir(parents=True, exist_ok=True)
    if url.startswith("sqlite:///"):  # found from any folder, not only the one run ran in
        url = f"sqlite:///{Path(url.removeprefix('sqlite:///')).resolve()}"
    path.write_text(json.dumps({"storage": url, "study": name}) + "\n")


def storage_file(url: str) -> Path | None:
    """The file of a SQLite or journal storage; None for a database server."""
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///") :])
    return Path(journal_path(url)) if _is_journal(url) else None


def known_studies(studies_dir: str | Path = "studies") -> list[str]:
    """The studies of the default SQLite files in `studies_dir`."""
    names = []
    for path in sorted(Path(studies_dir).glob("*.db")):
        try:
            names += optuna.get_all_study_names(f"sqlite:///{path}")
        except Exception as exc:  # an unreadable file is listed as nothing
            log.debug("cannot read %s: %s", path, exc)
    return names


def locate_study(storage: str | None, name: str | None, studies_dir="studies"):
    """(study, storage URL) of an existing study: --storage and --study; without --storage, the
    study's default SQLite file; without either, the last run's, else the only one there is."""
    if storage is None and name is None:
        last = Path(studies_dir) / LAST_RUN
        if last.is_file():
            remembered = json.loads(last.read_text())
            storage, name = remembered["storage"], remembered["study"]
        else:
            names = known_studies(studies_dir)
            if not names:
                raise UserError(f"no study in {studies_dir}/ yet: run `bash run.sh` first")
            if len(names) != 1:
                found = ", ".join(names)
                raise UserError(f"which study? {studies_dir}/ holds: {found}; pass --study NAME")
            name = names[0]
    url = storage or f"sqlite:///{Path(studies_dir) / name}.db"
    path = storage_file(url)
    exists = path.is_file() if path is not None else True
    opened = open_storage(url) if exists else None  # a missing driver: one line
    names = optuna.get_all_study_names(opened) if opened is not None else []
    if name is None:
        if len(names) != 1:
            raise UserError(f"which study? {url} holds: {', '.join(names) or 'none'}; pass --study")
        name = names[0]
    if name not in names:
        there = ", ".join(names) if storage else ", ".join(known_studies(studies_dir))
        where = storage or f"{studies_dir}/"
        there = there or "none (run `bash run.sh` first)"
        raise UserError(f"no study {name!r} in {where}; studies there: {there}")
    return optuna.load_study(study_name=name, storage=opened), url


def _is_journal(url: str) -> bool:
    return url.startswith("journal:") or "://" not in url


def journal_path(url: str) -> str:
    return re.sub(r"^journal:(//)?", "", url)


# A database storage's running trials beat every `heartbeat_s` (`heartbeat`); one silent for
# this many beats is failed by the next process that looks (`fail_stale_trials`).
GRACE_BEATS = 3
DRIVER_EXTRA = {"postgresql": "postgres"}


def open_storage(url: str, heartbeat_s: int | None = None):
    """An Optuna storage for a database URL or a journal file (`journal:PATH` or a plain path).
    With `heartbeat_s`, a database records the heartbeats of the trials this process runs."""
    if heartbeat_s is not None and heartbeat_s < 0:
        raise UserError(f"--heartbeat must be 0 (off) or more seconds, got {heartbeat_s}")
    if not _is_journal(url):
        kwargs = {}
        if url.startswith("sqlite:"):
            # Several workers on one SQLite file wait for the lock instead of failing.
            kwargs["engine_kwargs"] = {"connect_args": {"timeout": 60}}
        if heartbeat_s:
            kwargs.update(heartbeat_interval=heartbeat_s, grace_period=GRACE_BEATS * heartbeat_s)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, **kwargs)
        except ImportError as exc:
            raise _missing_driver(url, exc) from exc
        except Exception as exc:  # a scheme SQLAlchemy does not know, a file it cannot open
            raise _unusable(url, exc) from None
    path = journal_path(url)
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(path))
    except OSError as exc:
        raise _unusable(url, exc) from None


def _unusable(url: str, exc: Exception) -> UserError:
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
    return UserError(
        f"cannot open the storage {url} ({reason}); give sqlite:///PATH.db, "
        "postgresql://USER@HOST/DB or a journal file's path, in a writable folder that exists"
    )


def _missing_driver(url: str, exc: ImportError):
    dialect = url.split(":", 1)[0].split("+")[0]
    cause = exc.__cause__ or exc
    extra = DRIVER_EXTRA.get(dialect)
    fix = f'pip install -e ".[{extra}]"' if extra else "install the module it names"
    return UserError(f"the {dialect} storage's database driver is missing ({cause}): {fix}")


def dashboard_command(url: str) -> str:
    return f"optuna-dashboard {journal_path(url) if _is_journal(url) else url}"


# Finished trials before TPE models the study: the queued presets' results are its prior (a CPU
# queues three, a GPU more), so its first proposals are the leaders with an axis or two moved.
STARTUP_TRIALS = 3
# Candidates TPE draws for each proposal (Optuna's default 24): more of them pick the proposal
# most likely near the leaders; on tests/search/test_sampler.py's landscape the best assembly
# was found within 20 trials from 10 of 20 seeds, against 5 with 24 candidates.
EI_CANDIDATES = 64


def make_sampler(seed: int | None = None) -> optuna.samplers.BaseSampler:
    """Multi-objective TPE that ranks infeasible (wrong or too-close) trials below feasible ones,
    modelling the axes jointly (`multivariate`; `group`: the axes that apply depend on earlier
    choices) from the presets' results on."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # (`group`)
        return optuna.samplers.TPESampler(
            seed=seed,
            n_startup_trials=STARTUP_TRIALS,
            n_ei_candidates=EI_CANDIDATES,
            multivariate=True,
            group=True,
            constant_liar=True,
        )


def open_study(storage, name: str, fresh: bool = False, seed: int | None = None) -> optuna.Study:
    if fresh:
        try:
            optuna.delete_study(study_name=name, storage=storage)
            log.info("deleted the earlier study %s (--fresh)", name)
        except KeyError:
            pass
    study = optuna.create_study(
        storage=storage,
        study_name=name,
        directions=list(DIRECTIONS),
        sampler=make_sampler(seed),
        load_if_exists=True,
    )
    if list(study.metric_names or []) != list(METRIC_NAMES):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental (Optuna 5); the names are cosmetic
            study.set_metric_names(list(METRIC_NAMES))
    return study


def load_study(storage, name: str | None) -> optuna.Study:
    """An existing study; `name` may be omitted when the storage holds exactly one."""
    if name is None:
        names = optuna.get_all_study_names(storage)
        if len(names) != 1:
            raise SystemExit(f"the storage holds {len(names)} studies; name one with --study")
        name = names[0]
    return optuna.load_study(study_name=name, storage=storage, sampler=make_sampler())


def set_constraint(trial, value: float) -> None:
    trial.set_user_attr("constraint", [value])  # the records read it without Optuna
    trial.set_constraint("correctness", value)


def load_records(study: optuna.Study) -> list[Record]:
    """Every trial as a Record, with the full-protocol numbers the main job stored for it."""
    full, records = study.user_attrs.get("full_protocol", {}), []
    for trial in study.get_trials(deepcopy=False):
        attrs = {**trial.user_attrs, **full.get(str(trial.number), {})}
        status = {TrialState.RUNNING: "running", TrialState.WAITING: "waiting"}.get(trial.state)
        if status is None:
            status = attrs.get("status") or ("failed" if trial.state == TrialState.FAIL else "ok")
        done = trial.state == TrialState.COMPLETE and trial.values
        values = tuple(trial.values) if done else None
        records.append(Record(trial.number, status, attrs.get("variant"), attrs, values))
    return records


STARTED = (TrialState.RUNNING, TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)


def started_trials(study: optuna.Study) -> list:
    """Trials that count toward a trial target: started, and not skipped for being over it."""
    trials = study.get_trials(deepcopy=False, states=STARTED)
    return [t for t in trials if t.user_attrs.get("status") != "skipped"]


def heartbeat_interval(study: optuna.Study) -> int | None:
    """Seconds between a running trial's heartbeats, or None: a journal file, or a database
    opened without `heartbeat_s`."""
    storage = study._storage  # Optuna's cache in front of an RDBStorage, or a journal
    return storage.get_heartbeat_interval() if isinstance(storage, BaseHeartbeat) else None


@contextmanager
def heartbeat(study: optuna.Study, trials: list):
    """While the block runs, a thread records the heartbeat of each trial in `trials` every
    interval (the database's clock), so that when this process dies the others see the beats
    stop. Yields `hold(trial)`, which adds a trial to `trials` and records its first beat at
    once: a trial that never beat is never seen as silent, so a process killed before the
    thread's next beat would leave it running forever."""
    interval = heartbeat_interval(study)

    def record(trial) -> None:
        try:
            study._storage.record_heartbeat(trial._trial_id)
        except Exception as exc:  # a lost beat: the next may get through within the grace
            log.warning("heartbeat of trial %d not recorded: %r", trial.number, exc)

    def hold(trial) -> None:
        if trial not in trials:
            trials.append(trial)
            if interval is not None:
                record(trial)

    if interval is None:
        yield hold
        return
    stop = threading.Event()

    def beat():
        while True:
            for trial in list(trials):
                record(trial)
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    try:
        yield hold
    finally:
        stop.set()
        thread.join()


def fail_stale_trials(study: optuna.Study, older_than_s: float, own=()) -> int:
    """Fail the RUNNING trials whose process died: on a database with heartbeats, those silent
    for GRACE_BEATS beats; on a journal file, those older than `older_than_s`. `own`: this
    process's trials (asked ahead of their turn), never failed here."""
    storage, interval = study._storage, heartbeat_interval(study)
    mine = {t.number for t in own}
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    running = [t for t in running if t.number not in mine]
    if interval is not None:
        silent = set(storage._get_stale_trial_ids(study._study_id))  # by the database's clock
        stale = [t for t in running if t._trial_id in silent]
        why = f"stale: its process stopped beating (no heartbeat for {GRACE_BEATS * interval} s)"
    else:
        now = datetime.now()
        started = [t for t in running if t.datetime_start]
        stale = [t for t in started if (now - t.datetime_start).total_seconds() > older_than_s]
        why = "stale: its process died before it finished"
    count = 0
    for trial in stale:
        try:
            storage.set_trial_user_attr(trial._trial_id, "status", "failed")
            storage.set_trial_user_attr(trial._trial_id, "reason", why)
            count += storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
        except UpdateFinishedTrialError:  # another process failed it first
            continue
        log.warning("trial %d failed: %s", trial.number, why)
    return count


def earlier_best_variants(storage, name: str, hardware: str, studies_dir: Path | None) -> list:
    """Verified best variants of other studies on this hardware: in this storage and in the
    other SQLite files of `studies_dir` (one study per default file)."""
    found: list[tuple[str, dict]] = []
    storages = [storage]
    if studies_dir is not None and Path(studies_dir).is_dir():
        for path in sorted(Path(studies_dir).glob("*.db")):
            if path.stem != name and hardware in path.stem:
                storages.append(f"sqlite:///{path}")
    for store in storages:
        try:
            summaries = optuna.get_all_study_summaries(store, include_best_trial=False)
        except Exception as exc:  # an unreadable neighbour is not our problem
            log.debug("cannot read %s: %s", store, exc)
            continue
        for summary in summaries:
            attrs = summary.user_attrs
            best = attrs.get("verified_best")
            if summary.study_name != name and attrs.get("hardware") == hardware and best:
                found.append((summary.study_name, best["variant"]))
    return found


# --- the loop -------------------------------------------------------------------------------------


def enqueue_known_good(study, space, caps, storage, name, hardware, studies_dir) -> list[str]:
    """Enqueue the ranked defaults and earlier verified bests on this hardware (once per study);
    the costly presets are queued by the loop once the budget has time for them."""
    if study.get_trials(deepcopy=False):
        return []
    kind = device_type(caps)
    candidates = [
        (f"preset:{key}", v)
        for key, v in PRESETS.items()
        if caps.why_invalid(v) is not None or not space.is_costly(v, kind)
    ]
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
        enqueue(study, space, source, variant)
        queued.append(f"{source} ({variant.name})")
    log.info("enqueued %d known-good assemblies: %s", len(queued), "; ".join(queued))
    return queued


def device_type(caps) -> str:
    return "cuda" if caps.cuda else "cpu"


def costly_presets(study, space) -> list[tuple[str, Variant]]:
    """The costly presets (setup.COSTLY) valid here that the study has not run or queued."""
    kind = device_type(space.caps)
    there = [t.user_attrs.get("variant") for t in study.get_trials(deepcopy=False)]
    found = []
    for key, variant in PRESETS.items():
        if space.caps.why_invalid(variant) is None and space.is_costly(variant, kind):
            variant = space.canonical(variant)
            if variant.to_dict() not in there:
                found.append((f"preset:{key}", variant))
    return found


def costly_seconds(study, space) -> list[float]:
    """The seconds of each costly trial the study ran (not the copies)."""
    kind, seconds = device_type(space.caps), []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        if a.get("trial_seconds") and a.get("variant") and a.get("duplicate_of") is None:
            if space.is_costly(Variant.from_dict(a["variant"]), kind):
                seconds.append(a["trial_seconds"])
    return seconds


def untried_assemblies(study, space, skip: dict) -> list[Variant]:
    """The assemblies the space offers, less `skip`'s choices (axis -> values), that no trial
    has run, runs or waits to run (a timeout is no verdict: it may run again)."""
    done = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED, TrialState.RUNNING)
    done += (TrialState.WAITING,)  # queued
    run = {
        json.dumps(t.user_attrs["variant"], sort_keys=True)
        for t in study.get_trials(deepcopy=False, states=done)
        if t.user_attrs.get("variant")
        and t.user_attrs.get("duplicate_of") is None
        and t.user_attrs.get("status") != "skipped"
        and not t.user_attrs.get("timed_out")
    }
    offered = [v for v in space.assemblies if not any(getattr(v, a) in c for a, c in skip.items())]
    return [v for v in offered if json.dumps(v.to_dict(), sort_keys=True) not in run]


def untried(study, space, skip: dict) -> int:
    return len(untried_assemblies(study, space, skip))


def queue_next_untried(study, space, skip: dict, seed: int) -> bool:
    """After the sampler proposed an assembly already run: queue the untried one (within `skip`)
    that differs from the leader (the best correct screened trial) on the fewest axes, ties
    drawn with `seed`. False when nothing is left to run (none untried, none queued). Late in a
    search over a few hundred assemblies TPE proposes mostly ones already run (docs/PERF.md,
    the search on a CPU)."""
    if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        return True  # the next trial is queued already
    untried_now = untried_assemblies(study, space, skip)
    if not untried_now:
        return False
    leader = None
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        a = t.user_attrs
        if a.get("status") == "ok" and (a.get("constraint") or [1.0])[0] <= 0:
            if leader is None or a.get("tokens_per_s", 0) > leader.get("tokens_per_s", 0):
                leader = a
    best = leader["variant"] if leader else {}
    distance = lambda v: sum(value != best.get(k) for k, value in v.to_dict().items())  # noqa: E731
    near = min(map(distance, untried_now))
    pick = random.Random(seed).choice([v for v in untried_now if distance(v) == near])
    enqueue(study, space, NEAREST, pick)
    return True


def enqueue(study, space, source: str, variant: Variant) -> None:
    attrs = {"source": source, "variant": variant.to_dict(), "variant_name": variant.name}
    study.enqueue_trial(space.params_for(variant), user_attrs=attrs)


def find_duplicate(study, variant: Variant):
    """An earlier finished trial of the same variant whose result still stands (the trial that
    ran it, not a copy)."""
    values = variant.to_dict()
    done = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
    for trial in study.get_trials(deepcopy=False, states=done):
        attrs = trial.user_attrs
        if attrs.get("variant") != values or attrs.get("status") in ("skipped", None):
            continue
        if attrs.get("duplicate_of") is not None:
            continue
        if trial.state == TrialState.FAIL and attrs.get("timed_out"):
            continue  # a timeout may have been a short budget, not the variant
        return trial
    return None


def copy_result(study, trial, earlier) -> str:
    """A proposal of an assembly already run is not run again: it names the earlier trial and
    carries its status, and is told pruned, which TPE counts against proposing it again (told
    with the earlier values, each copy added weight where TPE already looked, and it proposed
    the same few assemblies again and again; told failed, TPE would not see it at all). Its
    numbers stay with the earlier trial: copied, they counted again in the medians of a trial's
    time and of the typical trial."""
    for key in ("variant", "variant_name"):
        trial.set_user_attr(key, earlier.user_attrs[key])
    trial.set_user_attr("duplicate_of", earlier.number)
    if earlier.state == TrialState.COMPLETE:
        status = "duplicate" if earlier.user_attrs.get("status") == "ok" else "infeasible"
    else:
        status = "failed" if earlier.state == TrialState.FAIL else "pruned"
    trial.set_user_attr("status", status)
    study.tell(trial, state=TrialState.PRUNED)
    return status


def tell_outcome(study, trial, outcome) -> None:
    for key, value in outcome.attrs.items():
        if key != "constraint":
            trial.set_user_attr(key, value)
    set_constraint(trial, outcome.constraint)
    if outcome.status == "failed":
        study.tell(trial, state=TrialState.FAIL)
    elif outcome.status == "pruned":
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, values=list(outcome.values))


def optimize(study, space, runner, budget: Budget, n_trials: int | None = None, ahead=None) -> int:
    """Run trials until `n_trials` have started, the budget is spent or every assembly has run;
    how many ran here. Costly assemblies (setup.COSTLY) are queued (presets) or proposed only
    while the budget affords one (`Budget.affords_costly`; the whole search's time once every
    other assembly has run). `ahead` (search/warmup.py's `WarmAhead`): the next trials are asked
    of the sampler while the current one runs, and their kernels compiled meanwhile."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    done = 0
    kind, deferred, start = device_type(space.caps), costly_presets(study, space), time.monotonic()
    costly_s, spent = costly_seconds(study, space), 0.0  # the study's costly trials; this process's
    beating: list = []  # this process's running trials (the one running, those asked ahead)

    def fits(trials: int) -> bool:  # whether the time left for trials holds this many typical
        left = budget.seconds_for_trials(runner.durations)
        return left >= trials * budget.typical_trial_s(runner.durations)

    with (
        tqdm(
            total=n_trials,
            initial=len(started_trials(study)),
            desc="trials",
            unit="trial",
            dynamic_ncols=True,
            disable=None,
        ) as bar,
        heartbeat(study, beating) as hold,
        asking_ahead(study, ahead) as asked,
    ):
        while True:
            limit = budget.time_for_trial(runner.durations)
            if limit is None:
                log.info("search budget spent after %d trial(s) in this process", done)
                break
            if not asked and n_trials is not None and len(started_trials(study)) >= n_trials:
                break
            fail_stale_trials(study, older_than_s=2 * budget.trial_timeout_s + 120, own=beating)
            searched = time.monotonic() - start
            affords = budget.affords_costly(runner.durations, costly_s, spent, searched)
            if not affords and untried(study, space, COSTLY[kind]) == 0:  # nothing else left
                affords = budget.affords_costly(runner.durations, costly_s, spent, searched, 1.0)
            waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
            if affords and deferred and not waiting:
                deferred = costly_presets(study, space)  # another process may have queued one
                if deferred:
                    enqueue(study, space, *deferred.pop(0))
            skip = {} if affords else COSTLY[kind]
            trial, variant = asked.pop(0) if asked else (ask(study), None)
            hold(trial)
            twin = queued_twin(study, trial)
            if twin is not None:  # two processes queued it at once: the first one runs it
                skip_trial(study, trial, f"queued twice; trial {twin} runs it")
                beating.remove(trial)
                continue
            earlier = sum(t.number < trial.number for t in started_trials(study))
            if n_trials is not None and earlier >= n_trials:
                skip_trial(study, trial, "the study reached its trial target meanwhile")
                beating.remove(trial)
                break
            variant = variant or propose(space, trial, skip)
            if ahead is not None:
                ask_ahead(study, space, ahead, asked, hold, skip, n_trials, fits)
            began = time.monotonic()
            paused = ahead.groups() if ahead is not None else ()
            summary, ran = _run_one(study, runner, trial, variant, limit, paused)
            if ahead is not None:
                ahead.resume()
            beating.remove(trial)
            if ran and space.is_costly(variant, kind):
                costly_s.append(time.monotonic() - began)
                spent += costly_s[-1]
            done += 1
            log.info("trial %d %s: %s", trial.number, variant.name, summary)
            bar.update(1)
            bar.set_postfix_str(summary[:60])
            if ran or queue_next_untried(study, space, skip, trial.number) or asked:
                continue
            left = f" but the costly ones ({axes(skip)}) the time left cannot fit" if skip else ""
            log.info("every assembly offered here%s has run: the search ends", left)
            break
    return done


@contextmanager
def asking_ahead(study, ahead):
    """The trials asked ahead of their turn, as (trial, variant) in order; when the search ends,
    those it did not reach are told skipped and `ahead`'s children are ended."""
    asked: list = []
    try:
        yield asked
    finally:
        for trial, _ in asked:
            skip_trial(study, trial, "asked ahead of its turn; the search ended first")
        if ahead is not None:
            ahead.close()


def propose(space, trial, skip: dict) -> Variant:
    """The trial's assembly: a proposal takes none of the `skip` choices (a queued trial takes
    its own)."""
    return space.suggest(trial, None if trial.user_attrs.get("source") else skip)


def ask(study) -> optuna.trial.Trial:
    with warnings.catch_warnings():
        # Optuna would beat only inside study.optimize; `heartbeat` does it here.
        warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used")
        return study.ask()


def skip_trial(study, trial, reason: str) -> None:
    """Tell `trial` failed as skipped (it never ran; it counts toward no trial target)."""
    trial.set_user_attr("status", "skipped")
    trial.set_user_attr("reason", reason)
    study.tell(trial, state=TrialState.FAIL)


def ask_ahead(study, space, ahead, asked: list, hold, skip: dict, n_trials, fits) -> None:
    """Ask the sampler for the next trials (up to `ahead.depth` waiting their turn, as many as
    `fits(count)` says the budget holds after the one running, within `n_trials`, while fewer
    than `ahead.workers` children run) and warm each new proposal's kernels (a proposal of an
    assembly already run is copied at its turn: nothing to warm). Each is proposed without the
    results of the trials still running before it (the sampler counts those as poor:
    `constant_liar`)."""
    while len(asked) < ahead.depth and ahead.running() < ahead.workers:
        if n_trials is not None and len(started_trials(study)) >= n_trials:
            return
        if not fits(len(asked) + 2):
            return
        trial = ask(study)
        hold(trial)  # (its heartbeat from now on)
        variant = propose(space, trial, skip)
        asked.append((trial, variant))
        if find_duplicate(study, variant) is None:
            ahead.warm(variant)


def queued_twin(study, trial) -> int | None:
    """The number of an earlier trial queued from the same source with the same assembly, not
    skipped, when `trial` was queued (two processes may queue one costly preset at once: the
    check before queueing and the queueing are not one step in the storage)."""
    attrs = trial.user_attrs
    if not attrs.get("source"):
        return None
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        if t.number >= trial.number or a.get("status") == "skipped" or a.get("timed_out"):
            continue  # (a timeout is no verdict: it may be queued again)
        if a.get("source") == attrs["source"] and a.get("variant") == attrs.get("variant"):
            return t.number
    return None


def axes(choices: dict) -> str:
    return ", ".join(f"{axis}={'/'.join(map(str, values))}" for axis, values in choices.items())


def _run_one(study, runner, trial, variant, limit: float, paused=()) -> tuple[str, bool]:
    """Run (or copy) the trial's variant and tell the study: a one-line summary, whether it
    ran. `paused`: process groups the trial stops before it times (the warm-up children)."""
    earlier = find_duplicate(study, variant)
    if earlier is not None:
        status = copy_result(study, trial, earlier)
        return f"same as trial {earlier.number}: {status}", False
    try:
        outcome = runner.run(
            variant, timeout_s=limit, prune_below=prune_bar(study, runner), paused=paused
        )
    except Exception as exc:  # the runner itself broke: record it, stop cleanly
        trial.set_user_attr("status", "failed")
        trial.set_user_attr("reason", f"trial runner error: {exc!r}")
        study.tell(trial, state=TrialState.FAIL)
        raise
    tell_outcome(study, trial, outcome)
    return _summary(outcome), True


def prune_bar(study, runner) -> dict:
    """Trace -> `PRUNE_SHARE` of the tokens/s there of the best correct screened trial."""
    best = None
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        a = t.user_attrs
        if a.get("status") != "ok" or (a.get("constraint") or [1.0])[0] > 0:
            continue
        if best is None or a.get("tokens_per_s", 0) > best.get("tokens_per_s", 0):
            best = a
    if best is None:
        return {}
    return {n: PRUNE_SHARE * best[f"tps_{n}"] for n in runner.traces if best.get(f"tps_{n}")}


def _summary(outcome) -> str:
    if outcome.status == "ok":
        return f"{outcome.values[0]:.1f} tokens/s, {outcome.values[1]:.0f} MiB"
    reason = (outcome.reason or "").strip().splitlines()
    return f"{outcome.status}: {reason[0] if reason else '?'}"
