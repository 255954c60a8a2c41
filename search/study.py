"""The study: its name, its storage, its sampler, and reading it back as records.

The storage URL is the single source of truth: trials, the model the study tunes (study user
attributes) and the verified best all live there, so a second run resumes and several workers
share one study. The default is `studies/<name>.db`, the name from the model's shape, the GPU (or
cpu) and the torch version: a study is only resumed on the hardware and software it measured.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import warnings
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import TrialState

from search.records import Record

log = logging.getLogger(__name__)

SHAPE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "torch_dtype",
)
DIRECTIONS = ("maximize", "minimize")
METRIC_NAMES = ("tokens_per_s", "peak_mib")
# Optuna >= 5 stores constraints per trial; 3.x/4.x only take a sampler-side constraints_func.
HAS_SET_CONSTRAINT = hasattr(optuna.trial.Trial, "set_constraint")


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


def default_storage_url(name: str, studies_dir: str | Path = "studies") -> str:
    Path(studies_dir).mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{Path(studies_dir) / name}.db"


LAST_RUN = "last_run.json"  # in the studies folder: the study the last `run` wrote


def remember_last_run(studies_dir: str | Path, url: str, name: str) -> None:
    path = Path(studies_dir) / LAST_RUN
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"storage": url, "study": name}) + "\n")


def _sqlite_path(url: str) -> Path | None:
    return Path(url[len("sqlite:///") :]) if url.startswith("sqlite:///") else None


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
    """(study, storage URL) of an existing study, creating nothing: --storage and --study as
    given; without --storage, the study's default SQLite file; without either, the study the
    last `run` wrote, else the only one there is. A wrong name lists the studies that exist."""
    from search.errors import UserError

    if storage is None and name is None:
        last = Path(studies_dir) / LAST_RUN
        if last.is_file():
            remembered = json.loads(last.read_text())
            storage, name = remembered["storage"], remembered["study"]
        else:
            names = known_studies(studies_dir)
            if len(names) != 1:
                found = ", ".join(names) or "none"
                raise UserError(f"which study? {studies_dir}/ holds: {found}; pass --study NAME")
            name = names[0]
    url = storage or f"sqlite:///{Path(studies_dir) / name}.db"
    path = _sqlite_path(url)
    exists = path.is_file() if path is not None else True
    if _is_journal(url):
        exists = Path(journal_path(url)).is_file()
    opened = open_storage(url) if exists else None  # a missing driver: one line
    names = optuna.get_all_study_names(opened) if opened is not None else []
    if name is None:
        if len(names) != 1:
            raise UserError(f"which study? {url} holds: {', '.join(names) or 'none'}; pass --study")
        name = names[0]
    if name not in names:
        there = ", ".join(names) if storage else ", ".join(known_studies(studies_dir))
        where = storage or f"{studies_dir}/"
        raise UserError(f"no study {name!r} in {where}; studies there: {there or 'none'}")
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
        from search.errors import UserError

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
    path = journal_path(url)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        from optuna.storages.journal import JournalFileBackend

        backend = JournalFileBackend(path)
    except ImportError:  # Optuna < 4.0
        backend = optuna.storages.JournalFileStorage(path)
    return optuna.storages.JournalStorage(backend)


def _missing_driver(url: str, exc: ImportError):
    from search.errors import UserError

    dialect = url.split(":", 1)[0].split("+")[0]
    cause = exc.__cause__ or exc
    extra = DRIVER_EXTRA.get(dialect)
    fix = f'pip install -e ".[{extra}]"' if extra else "install the module it names"
    return UserError(f"the {dialect} storage's database driver is missing ({cause}): {fix}")


def dashboard_command(url: str) -> str:
    return f"optuna-dashboard {journal_path(url) if _is_journal(url) else url}"


def _constraints(trial) -> list[float]:
    return list(trial.user_attrs.get("constraint", [1.0]))


def make_sampler(seed: int | None = None) -> optuna.samplers.BaseSampler:
    """Multi-objective TPE that ranks infeasible (wrong or too-close) trials below feasible ones."""
    kwargs = {} if HAS_SET_CONSTRAINT else {"constraints_func": _constraints}
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=8, constant_liar=True, **kwargs)


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
            warnings.simplefilter("ignore")  # experimental in Optuna 3.x-5.x; names are cosmetic
            study.set_metric_names(list(METRIC_NAMES))
    return study


def load_study(storage, name: str | None, seed: int | None = None) -> optuna.Study:
    """An existing study; `name` may be omitted when the storage holds exactly one."""
    if name is None:
        names = optuna.get_all_study_names(storage)
        if len(names) != 1:
            raise SystemExit(f"the storage holds {len(names)} studies; name one with --study")
        name = names[0]
    return optuna.load_study(study_name=name, storage=storage, sampler=make_sampler(seed))


def set_constraint(trial, value: float) -> None:
    trial.set_user_attr("constraint", [value])
    if HAS_SET_CONSTRAINT:
        trial.set_constraint("correctness", value)


def record_from_trial(trial, full: dict | None = None) -> Record:
    attrs = dict(trial.user_attrs)
    if full:
        attrs.update(full)
    if trial.state == TrialState.RUNNING:
        status = "running"
    elif trial.state == TrialState.WAITING:
        status = "waiting"
    else:
        status = attrs.get("status") or ("failed" if trial.state == TrialState.FAIL else "ok")
    values = tuple(trial.values) if trial.state == TrialState.COMPLETE and trial.values else None
    return Record(trial.number, status, attrs.get("variant"), attrs, values)


def load_records(study: optuna.Study) -> list[Record]:
    full = study.user_attrs.get("full_protocol", {})
    return [record_from_trial(t, full.get(str(t.number))) for t in study.get_trials(deepcopy=False)]


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
def heartbeat(study: optuna.Study, trial):
    """While the block runs, a thread records the trial's heartbeat every interval (the
    database's clock), so that when this process dies the others see the beats stop."""
    interval = heartbeat_interval(study)
    if interval is None:
        yield
        return
    stop = threading.Event()

    def beat():
        while True:
            try:
                study._storage.record_heartbeat(trial._trial_id)
            except Exception as exc:  # a lost beat: the next may get through within the grace
                log.warning("heartbeat of trial %d not recorded: %r", trial.number, exc)
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial.number}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def fail_stale_trials(study: optuna.Study, older_than_s: float) -> int:
    """Mark RUNNING trials whose process died as failed. On a database with heartbeats: those
    silent for the grace period (GRACE_BEATS). Elsewhere (a journal file): those older than any
    trial limit (`older_than_s`), by this machine's clock against the starting one's."""
    storage, interval = study._storage, heartbeat_interval(study)
    if interval is not None:
        silent = set(storage._get_stale_trial_ids(study._study_id))  # by the database's clock
        why = f"stale: its process stopped beating (no heartbeat for {GRACE_BEATS * interval} s)"
    else:
        why = "stale: its process died before it finished"
    now = datetime.now()

    def is_stale(trial) -> bool:
        if interval is not None:
            return trial._trial_id in silent
        return (
            bool(trial.datetime_start)
            and (now - trial.datetime_start).total_seconds() > older_than_s
        )

    count = 0
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not is_stale(trial):
            continue
        try:
            storage.set_trial_user_attr(trial._trial_id, "status", "failed")
            storage.set_trial_user_attr(trial._trial_id, "reason", why)
            count += storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
        except UpdateFinishedTrialError:  # another process failed it first
            continue
        log.warning("trial %d failed: %s", trial.number, why)
    return count


def update_study_attr(study: optuna.Study, key: str, update: dict) -> None:
    """Merge `update` into the dict study attribute `key` (read-modify-write)."""
    current = dict(study.user_attrs.get(key, {}))
    current.update(update)
    study.set_user_attr(key, current)


def earlier_best_variants(storage, name: str, hardware: str, studies_dir: Path | None) -> list:
    """Verified best variants of other studies on the same hardware: in this storage, and in the
    other default SQLite files of `studies_dir` (the default storage keeps one study per file)."""
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
