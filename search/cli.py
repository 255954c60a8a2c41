"""`python -m search COMMAND`: the command line of the search, and the main job (`run`, what
`bash run.sh` does) phase by phase."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import logging
import os
import shlex
import sys
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from evaluator.engine_loader import EngineLoadError, OneLineParser
from search.kernel_phase import kernel_contest
from search.report import default_report_dir, render_log, summary, trial_line
from search.setup import (
    COSTLY,
    COSTLY_SHARE,
    DEFAULT_TRIAL_TIMEOUT_S,
    ENGINES_ALIVE,
    Budget,
    SearchSpace,
    check_arguments,
    choose_gate,
    device_kind,
    measure_ceilings,
    scratch_dir,
    set_up,
)
from search.sweep_command import sweep_leaders
from search.trial import (
    DEFAULT_RENDERER,
    OBJECTIVE_TRACES,
    Record,
    TrialRunner,
    load_renderer,
    neutral_tables,
    write_atomic,
)
from search.warmup import warm_ahead, warm_first, warm_queued
from search.write import (
    candidates,
    common_failure,
    header,
    installed,
    rank,
    remeasure,
    remember,
    set_aside,
    verify_engine,
    write_verified,
)
from variants.checkpoint.preflight import TargetError, resolve_target
from variants.presets import ranked_defaults
from variants.probe import UserError, probe_capabilities, resolve_device
from variants.variant import Variant

# search.study and search.figures import Optuna and matplotlib: the functions that open a study or
# draw import them, so the main job runs without Optuna (--no-optuna, or none installed) and the
# other commands start without either.

log = logging.getLogger("search")

# flag: add_argument's keywords; a command takes the flags COMMANDS lists for it
OPTIONS = {
    "--log-level": dict(
        default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="(default INFO)"
    ),
    "--debug": dict(action="store_true", help="show a user error's traceback, not one line"),
    "--model-config": dict(help="model config (default /target/model_config.json, else target/)"),
    "--weight-dir": dict(help="its weights (default /target/weights, else target/weights)"),
    "--device": dict(default="auto", help="auto, cpu, cuda or cuda:N (default auto)"),
    "--storage": dict(help="Optuna storage URL or journal file (default studies/<study>.db)"),
    "--study": dict(help="study name (default: run derives it; the others take the last run's)"),
    "--studies-dir": dict(default="studies", help="where default SQLite studies live"),
    "--budget-minutes": dict(type=float, help="wall-clock budget (run: 20 on a GPU, 5 on a CPU)"),
    "--trials": dict(type=int, help="stop when the study holds this many trials"),
    "--trial-timeout": dict(type=float, help="seconds per trial (default 300 GPU, 180 CPU)"),
    "--seed": dict(type=int, help="sampler seed (default random)"),
    "--heartbeat": dict(
        type=int,
        default=20,
        metavar="SECONDS",
        help="a running trial's heartbeat on a database; three missed fail it (default 20; 0: off)",
    ),
    "--renderer": dict(
        default=DEFAULT_RENDERER, help="module:function or file.py:function writing engine files"
    ),
    "--gate": dict(
        choices=("auto", "course", "noise"),
        default="auto",
        help="course: the grader's allclose; noise: the error in rounding-noise units; auto "
        "(default): course for the course's float16 target, else noise",
    ),
    "--memory-budget-gib": dict(
        type=float,
        help="most memory the grader's pattern (three engines alive) may take; the engine holds a "
        "third (default 24 for the course's target, else this device's)",
    ),
    "--remeasure": dict(
        type=int, default=3, help="leaders re-measured with the grader's full protocol (default 3)"
    ),
    "--warm-workers": dict(
        type=int,
        help="on a GPU, compile the queued Triton kernels this many at once, and the next "
        "proposals' while a trial runs (0: off)",
    ),
    "--kernel-search": dict(
        action=argparse.BooleanOptionalAction,
        default=True,
        help="on a GPU, search the chosen engine's decode-attention launch (default on)",
    ),
    "--neutral-kernels": dict(
        action="store_true", help="start from neutral kernel launches, not the H200's rules"
    ),
    "--fresh": dict(action="store_true", help="delete the study and start over"),
    "--workspace": dict(default="workspace", help="where engine.py and results.log go"),
    "--traces": dict(help=f"objective traces (default {','.join(OBJECTIVE_TRACES)})"),
    "--no-optuna": dict(action="store_true", help="measure the ranked defaults only"),
    "--top": dict(type=int, default=5, help="rows in the top table (default 5)"),
    "--all": dict(action="store_true", help="also list every trial"),
    "--out": dict(help="folder of the figures and summary.md (default studies/<study>/)"),
    "--no-plots": dict(action="store_true", help="print the tables only"),
    "--sweep": dict(help="a sweep JSON to draw (default: --out's sweep.json, when there)"),
    "--trial": dict(type=int, help="trial number (default: the verified best)"),
    "--output": dict(required=True, help="engine file to write"),
}
TARGET = ("--model-config", "--weight-dir", "--device")
STUDY = ("--storage", "--study", "--studies-dir")
SEARCH = ("--budget-minutes", "--trials", "--trial-timeout", "--seed", "--heartbeat", "--renderer")
RUN = ("--gate", "--memory-budget-gib", "--remeasure", "--warm-workers", "--kernel-search")
RUN += ("--neutral-kernels", "--fresh", "--workspace", "--traces", "--no-optuna")
REPORT = ("--top", "--all", "--out", "--no-plots", "--sweep")
RENDER = ("--trial", "--output", "--renderer")

# name: ("module:function" that runs it, its flags, its help); its description is the function's
# docstring, or for OWN_FLAGS, whose modules add flags (add_arguments), the module's
COMMANDS = {
    "run": ("search.cli:run", TARGET + STUDY + SEARCH + RUN, "search, verify, write the engine"),
    "worker": ("search.cli:worker", TARGET + STUDY + SEARCH, "add trials to a shared study"),
    "report": ("search.cli:report", STUDY + REPORT, "a study's tables, figures and summary"),
    "render": ("search.report:render", STUDY + RENDER, "write one trial's engine file"),
    "sweep": (
        "search.sweep_command:sweep_command",
        TARGET + STUDY,
        "time engines over shapes (JSON)",
    ),
    "import-gguf": ("models.import_gguf:import_gguf_command", (), "GGUF LLaMA to an HF folder"),
    "generate": ("serving.generate:generate_command", (), "generate text with an engine file"),
    "serve": ("serving.serve:serve_command", (), "an OpenAI-compatible server over an engine"),
}
OWN_FLAGS = ("sweep", "import-gguf", "generate", "serve")


def _runner(name: str):
    module, _, function = COMMANDS[name][0].partition(":")
    module = importlib.import_module(module)
    return module, getattr(module, function)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m search", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, flags, short) in COMMANDS.items():
        module, function = _runner(name)
        doc = inspect.cleandoc((module if name in OWN_FLAGS else function).__doc__)
        raw = argparse.RawDescriptionHelpFormatter  # the docstring keeps its lines
        p = sub.add_parser(name, help=short, description=doc, formatter_class=raw)
        for flag in ("--log-level", "--debug", *flags):
            p.add_argument(flag, **OPTIONS[flag])
        if name in OWN_FLAGS:
            module.add_arguments(p)
    return parser


def configure_logging(level: str) -> None:
    """Our lines at `level`; matplotlib's own at WARNING unless DEBUG is asked (Optuna's slice
    plot hands it categories that read as numbers, and it says so at INFO, a line a figure)."""
    logging.basicConfig(
        level=getattr(logging, level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if level != "DEBUG":
        logging.getLogger("matplotlib").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    """The command's exit code: 0 done, 1 its job failed, 2 a user error (one line; the
    traceback with --debug)."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    args.command_line = shlex.join(argv)
    try:
        check_arguments(args)
        return _runner(args.command)[1](args)
    except (UserError, TargetError, EngineLoadError) as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of the output left (`report | head`): nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (no flush error at exit)
        return 0
    except KeyboardInterrupt:  # Ctrl-C: what is on disk was written whole (write_atomic)
        if args.debug:
            raise
        print("interrupted", file=sys.stderr)
        return 130


# --- the main job: `python -m search run` (what `bash run.sh` does) ------------------------------


def run(args) -> int:
    """Probe this machine, run (or resume) the study, re-measure the leaders like the grader,
    write the best engine that passes verification to workspace/engine.py and explain it in
    workspace/results.log. Exit 0 only when the written engine passed verification."""
    return RunJob(args).run()


def launched_s_ago() -> float:
    """Seconds since run.sh began (AUTOTUNER_STARTED_AT: its checks, not its installs), which
    the budget counts; 0 without it, or where it is not of the last ten minutes."""
    try:
        ago = time.time() - float(os.environ.get("AUTOTUNER_STARTED_AT", ""))
    except ValueError:
        return 0.0
    return ago if 0.0 <= ago <= 600.0 else 0.0


class RunJob:
    """One run's state: `set_up` fills in the device, target, space, budget and runner; the
    search the study and its storage; the later phases read them and add notes for the log."""

    def __init__(self, args):
        self.args = args
        self.start = time.monotonic() - launched_s_ago()
        self.phases: dict[str, float] = {}  # seconds per phase, for the results log
        self.notes: list[str] = []
        self.workspace = Path(args.workspace)
        self.storage_url = self.study_name = self.dashboard = None
        self.study = None

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    @contextmanager
    def phase(self, name: str, fallible: str | None = None):
        """Time the block as the phase `name`. A `fallible` step's failure is logged and noted,
        and the job goes on: lost numbers or figures are not worth the engine."""
        start = time.monotonic()
        try:
            yield
        except Exception as exc:
            if fallible is None:
                raise
            log.warning("%s failed (the job goes on): %r", fallible, exc)
            log.debug("%s's traceback", fallible, exc_info=True)
            self.notes.append(f"{fallible} failed: {exc!r}")
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.monotonic() - start

    def run(self) -> int:
        """The phases in order: set-up, the search, the full-protocol re-measurement of the
        leaders, the kernel search (the leader's and a close rival's: the engine faster with its
        tables goes first), verify-and-write, a short shape sweep of the leaders, the
        figures and the results log. A resumed study spends the new budget on new trials; only
        one that already ran the `--trials` asked for keeps its verified best (rendered,
        re-verified and written in seconds)."""
        self.phases["start-up"] = time.monotonic() - self.start  # run.sh's checks, the imports
        with self.phase("set-up"):
            set_up(self)
        with self.phase("search"):
            records, standing = search_trials(self)
        if standing is None:
            with self.phase("full-protocol re-measure", "the full-protocol re-measurement"):
                remeasure(self, records)
        ranked, self.kernels, self.contest = rank(records), None, None
        if standing is None and ranked:
            with self.phase("kernel search", "the kernel search"):  # (the rules stay)
                self.kernels, ranked, self.contest = kernel_contest(self, ranked)
        with self.phase("verify and write"):
            attempts = self.write_engine(records, ranked, standing)
        done = installed(attempts)
        if done is not None:
            remember(self, done.record)
            if standing is None and self.study is not None:  # the next run's estimate
                self.study.set_user_attr("verify_seconds", round(done.verification.seconds, 1))
            log.info("wrote %s: %s", self.workspace / "engine.py", done.record.name)
            if self.study is not None:
                with self.phase("shape sweep"):
                    self.notes += sweep_leaders(self, reuse=standing is not None)
        else:
            aside = set_aside(self)
            self.notes.append(aside)
        if self.study is not None:
            from search.figures import write_report

            out = default_report_dir(self.storage_url, self.study_name, self.args.studies_dir)
            with self.phase("figures", "writing the study figures"):
                paths = write_report(self.study, out)
                self.notes.append(
                    f"figures and summary in {out}: " + ", ".join(p.name for p in paths)
                )
        self.phases["total"] = time.monotonic() - self.start
        write_atomic(self.workspace / "results.log", render_log(self, records, ranked, attempts))
        log.info("wrote %s", self.workspace / "results.log")
        if done is None:  # the last line says why
            log.error(
                "no engine written: no candidate passed verification (most often: %s); %s",
                common_failure(records, attempts),
                aside,
            )
        return 0 if done is not None else 1

    def write_engine(self, records, ranked, standing):
        """Render, verify and install the first candidate that passes: the standing best, else
        the ranked trials and then the defaults; the kernel search's kept tables for its leader
        (and for the contest's other contender, should the first fail verification)."""

        def tables(found) -> dict:
            if found is None or not found.kept:
                return {}
            knobs = (found.table, found.few_row.table, found.prefill.table)
            names = ("knobs", "few_row_knobs", "prefill_knobs")
            return {name: v for name, v in zip(names, knobs) if v}

        searched = [(ranked[0].variant, tables(self.kernels))] if ranked else []
        contest = getattr(self, "contest", None)
        if contest is not None:
            other = (contest.leader, contest.searches[0]) if contest.won else (
                contest.rival, contest.searches[1]
            )  # fmt: skip
            searched.append((other[0].variant, tables(other[1])))
        first = [] if standing is None else [standing]
        taken = {r.number for r in first}
        rest = [r for r in candidates(self, records, ranked) if r.number not in taken]
        renderer = load_renderer(self.args.renderer)
        budget, weights = self.runner.engine_budget_gib, self.target.weights_format

        def render(variant, path, text):
            mine = variant.to_dict()
            knobs = next((t for v, t in searched if Variant.from_dict(v).to_dict() == mine), {})
            if self.runner.kernel_prior == "neutral":  # no hand rule: neutral where no table
                knobs = {**neutral_tables(self.device, self.target.config, variant), **knobs}
            return renderer(variant, path, text, budget, weights=weights, **knobs)

        verify = partial(
            verify_engine,
            config_path=self.target.config_path,
            weight_dir=self.target.weight_dir,
            device=self.device,
            timeout_s=self.verify_timeout,
            benchmark=standing is None,
            gate=self.gate,
            stress_positions=self.stress_positions,
        )
        return write_verified(first + rest, render, self.workspace, verify, partial(header, self))


# --- the search phase of the main job ----------------------------------------------------------
# The Optuna study (resumed, its model recorded, known-good assemblies first, their Triton
# kernels compiled side by side on a GPU, then the sampler inside the budget) or, without Optuna,
# the ranked defaults alone. A study that already ran the --trials asked for is not searched again.


def search_trials(job) -> tuple[list[Record], Record | None]:
    """The study (or the defaults alone); if the machinery itself breaks, whatever trials
    finished, so that an engine is still verified and written."""
    try:
        if job.args.no_optuna or importlib.util.find_spec("optuna") is None:
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

    args = job.args
    target = job.target
    name = args.study or st.study_name(target.config, job.caps, target.fingerprint, job.gate)
    if job.runner.kernel_prior == "neutral" and not args.study:  # its trials time other launches
        name += "-neutral-kernels"
    url = args.storage or st.default_storage_url(name, args.studies_dir)
    job.storage_url, job.study_name, job.dashboard = url, name, st.dashboard_command(url)
    storage = st.open_storage(url, heartbeat_s=args.heartbeat)
    study = job.study = st.open_study(storage, name, fresh=args.fresh, seed=args.seed)
    check_same_model(job, study)
    if args.storage is None:
        st.remember_last_run(args.studies_dir, url, name)
    st.fail_stale_trials(study, older_than_s=2 * job.trial_timeout + 120)
    records = st.load_records(study)
    job.budget.verify_s = study.user_attrs.get("verify_seconds")  # as this study measured it
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
    queued = st.enqueue_known_good(study, job.space, job.caps, storage, name, hardware, studies_dir)
    if queued:
        job.notes.append("enqueued first: " + "; ".join(queued))
    elif records:
        job.notes.append(f"resumed study {name} with {len(records)} earlier trial(s)")
    costly = [f"{axis}={'/'.join(v)}" for axis, v in COSTLY[device_kind(job.device)].items()]
    later = "; ".join(f"{source} ({v.name})" for source, v in st.costly_presets(study, job.space))
    job.notes.append(
        f"costly here ({', '.join(costly)}): queued{f' ({later})' if later else ''} or proposed "
        f"only while one fits in the time left for trials and they keep within "
        f"{COSTLY_SHARE:.0%} of the search's seconds"
    )
    job.runner.durations += [
        r.attrs["trial_seconds"]
        for r in records
        if r.status in ("ok", "infeasible") and r.attrs.get("trial_seconds")
    ]
    seconds = job.runner.keep_references()
    job.notes.append(f"the gate's references computed once for every trial in {seconds:.1f} s")
    warmed, compiled = warm_queued(job, study)
    if warmed:
        job.notes.append(warmed)
    ahead = warm_ahead(job, compiled)
    st.optimize(study, job.space, job.runner, job.budget, n_trials=args.trials, ahead=ahead)
    warmed = ahead.close() if ahead is not None else None  # (closed already: its note)
    if warmed:
        job.notes.append(warmed)
    return st.load_records(study), None


def check_same_model(job, study) -> None:
    """A study resumes only over the weights and gate it measured (its name says so unless
    --study named it)."""
    for key, now in (("weights_fingerprint", job.target.fingerprint), ("gate", job.gate)):
        then = study.user_attrs.get(key)
        if then is not None and then != now:
            raise UserError(
                f"study {study.study_name} measured another {key.replace('_', ' ')} ({then}; "
                f"this run: {now}): pass --fresh to start it over, or another --study"
            )


def prepare_study(job, study) -> None:
    """The study attributes that say what it measures and how (workers read them)."""
    from search.study import model_attrs

    attrs = {
        **model_attrs(job.target, job.gate, job.caps),
        "weights_file": job.target.weights_file,
        "capabilities": job.caps.to_dict(),
        "space": {name: list(choices) for name, choices in job.space.describe()},
        "traces": list(job.runner.traces),
        "objectives": "maximize geometric-mean tokens/s over the traces; minimize peak MiB",
        "ceilings": job.runner.ceilings,
        "memory_budget_gib": job.memory_budget_gib,
        "kernel_prior": job.runner.kernel_prior,  # (a worker's trials render the same launches)
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
    if best.get("n_trials") != started or job.args.trials is None or job.args.trials > started:
        return None  # newer trials (other workers), a budget to spend on more, or more asked for
    variant = Variant.from_dict(best["variant"])
    if job.caps.why_invalid(variant) is not None:
        return None
    for r in records:
        if r.number == best["trial"]:
            return r
    return Record(best["trial"], "ok", best["variant"], {"variant_name": variant.name})


def search_defaults(job) -> list[Record]:
    """No Optuna: the ranked defaults, each in its own process, inside the budget."""
    job.runner.ceilings = measure_ceilings(job.device)
    defaults = ranked_defaults(job.caps)[: job.args.trials or None]
    defaults = [job.space.canonical(v) for v in defaults]
    warmed, _ = warm_first(job, defaults)
    if warmed:
        job.notes.append(warmed)
    records = []
    for number, variant in enumerate(defaults):
        limit = job.budget.time_for_trial(job.runner.durations)
        if limit is None:
            break
        outcome = job.runner.run(variant, timeout_s=limit)
        log.info("default %d %s: %s", number, variant.name, outcome.status)
        records.append(
            Record(number, outcome.status, variant.to_dict(), outcome.attrs, outcome.values)
        )
    return records


# --- the worker: `python -m search worker` -----------------------------------------------------


def worker(args) -> int:
    """Add trials to the study in a shared --storage (one worker per GPU, or per machine on a
    database); workers on one storage share its trial target. The model is the study's unless
    --model-config/--weight-dir say otherwise (weights at another path on another machine).
    Workers never write engine.py: the next `run` on the storage chooses, verifies and writes it.
    A dead worker's trial is failed by the next process that looks: on a database when its
    heartbeat stops, on a journal file when it is older than any trial limit."""
    import optuna

    from search import study as st

    start = time.monotonic()
    device = resolve_device(args.device)
    if args.storage is None:
        raise UserError("name the shared storage of the study with --storage")
    if args.study is None and not args.model_config:
        raise UserError("name the study to add trials to with --study (or give --model-config)")
    path = st.storage_file(args.storage)
    if path is not None and not path.is_file() and not args.model_config:  # (opening creates it)
        raise UserError(
            f"no storage at {path}: a worker adds trials to a study that `python -m search run "
            f"--storage {args.storage}` made there"
        )
    storage = st.open_storage(args.storage, heartbeat_s=args.heartbeat)
    name = args.study
    known = name is not None and name in optuna.get_all_study_names(storage)
    attrs = st.load_study(storage, name).user_attrs if known else {}
    config_path = args.model_config or attrs.get("model_config_path")
    if not config_path:
        raise UserError(f"no study {name!r} in {args.storage}: create it with `python -m "
                        "search run --storage ...`, or pass --model-config")  # fmt: skip
    target = resolve_target(config_path, args.weight_dir or attrs.get("weight_dir"))
    caps = probe_capabilities(device, target.config)
    hardware = st.hardware_key(caps)
    gate, _ = choose_gate(attrs.get("gate") or "auto", target)  # the study's gate
    name = name or st.study_name(target.config, caps, target.fingerprint, gate.name)
    study = st.open_study(storage, name, seed=args.seed)
    attrs = study.user_attrs
    if attrs.get("weights_fingerprint") not in (None, target.fingerprint):
        raise UserError(
            f"the weights in {target.weight_dir} are not the ones study {study.study_name} "
            "measured; pass --weight-dir with that study's weights"
        )
    if attrs.get("hardware") and attrs["hardware"] != hardware:
        log.warning(
            "this worker runs on %s but the study measured %s: numbers will not compare",
            hardware,
            attrs["hardware"],
        )
    for key, value in st.model_attrs(target, gate.name, caps).items():
        if not attrs.get(key):
            study.set_user_attr(key, value)
    space = SearchSpace(caps)
    st.enqueue_known_good(study, space, caps, storage, study.study_name, hardware, None)
    timeout = args.trial_timeout or DEFAULT_TRIAL_TIMEOUT_S[device_kind(device)]
    st.fail_stale_trials(study, older_than_s=2 * timeout + 120)  # a dead worker's trials
    gib = attrs.get("memory_budget_gib")  # the study's, as `run` recorded it
    runner = TrialRunner(
        target.config,
        str(target.weight_dir),
        device,
        renderer=args.renderer,
        traces=tuple(attrs.get("traces") or OBJECTIVE_TRACES),
        timeout_s=timeout,
        ceilings=attrs.get("ceilings") or measure_ceilings(device),
        gate=gate.to_dict(),
        kernel_prior=attrs.get("kernel_prior") or "hand",  # the study's (--neutral-kernels)
        noise_cache=scratch_dir("search-noise-"),
        memory_budget_mib=1024 * gib if gib else None,
        engine_budget_gib=gib / ENGINES_ALIVE if gib else None,
    )
    minutes = args.budget_minutes or 24 * 60
    budget = Budget(start + 60 * minutes, timeout)
    ran = st.optimize(study, space, runner, budget, n_trials=args.trials)
    log.info("worker done: %d trial(s) run here; the study now has %d", ran, len(study.trials))
    return 0


# --- `python -m search report` -----------------------------------------------------------------


def report(args) -> int:
    """Print a study's counts, top-N table, the leader's per-trace numbers and the verified best
    from its storage; write its PNG figures and summary.md (default: next to the storage)."""
    from search.study import dashboard_command, load_records, locate_study

    study, url = locate_study(args.storage, args.study, args.studies_dir)
    records = load_records(study)
    print(f"study {study.study_name} in {url}")
    print(summary(records, rank(records), args.top))
    best = study.user_attrs.get("verified_best")
    if best:
        print(
            f"\nverified best: trial {best['trial']} {best['variant_name']} "
            f"({best['tokens_per_s']:.1f} tokens/s, verified {best['verified_at']})"
        )
    if args.all:
        print("\nAll trials:")
        for r in records:
            print(trial_line(r))
    if not args.no_plots:
        from search.figures import write_report

        default = default_report_dir(url, study.study_name, args.studies_dir)
        out = Path(args.out) if args.out else default
        paths = write_report(study, out, args.top, args.sweep)
        print(f"\nwrote {len(paths)} file(s) in {out}: " + ", ".join(p.name for p in paths))
    print(f"\ndashboard: {dashboard_command(url)}")
    return 0
