"""`python -m search run|worker|report|render|sweep`: the command line of the search.

run     the main job (what `bash run.sh` does): search, choose, verify, write workspace/engine.py
worker  add trials to a study in a shared storage (one per GPU, or per machine)
report  the top-N table and per-trace numbers of a study, from its storage, plus PNG figures
        and summary.md next to it
render  write the engine of one trial (default: the verified best) to a file
sweep   measure engines over shapes (decode step time vs batch size, prefill tokens/s vs prompt
        length) into a JSON file that report draws
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import shlex
import sys
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from search.report import default_report_dir, render_log
from search.setup import UserError, measure_ceilings, set_up
from search.trial import DEFAULT_RENDERER, OBJECTIVE_TRACES, Record, load_renderer, write_atomic
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
from tuning.warmup import warm_first, warm_queued
from variants.presets import ranked_defaults
from variants.variant import Variant

log = logging.getLogger("search")


def _study_options(p, storage_required: bool = False) -> None:
    p.add_argument(
        "--storage",
        required=storage_required,
        help="Optuna storage: sqlite:///path.db, postgresql://..., or a journal file "
        "(journal:PATH or a plain path) for several processes; default studies/<study>.db",
    )
    p.add_argument(
        "--study",
        help="study name; default: for run, derived from the model, its weights, the gate, the "
        "GPU (or cpu) and torch; for the other commands, the study the last run wrote",
    )
    p.add_argument("--studies-dir", default="studies", help="where default SQLite studies live")


def _target_options(p) -> None:
    p.add_argument(
        "--model-config",
        help="model_config.json (default /target/model_config.json, else target/model_config.json)",
    )
    p.add_argument(
        "--weight-dir",
        help="directory holding model.pt (default /target/weights, else target/weights; "
        "toy weights are generated there when missing, except under /target)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")


def _search_options(p) -> None:
    p.add_argument(
        "--trials",
        type=int,
        help="stop when the study holds this many trials (default: until the budget is spent)",
    )
    p.add_argument(
        "--trial-timeout", type=float, help="seconds per trial (default 300 GPU, 180 CPU)"
    )
    p.add_argument("--seed", type=int, help="sampler seed (default random)")
    p.add_argument(
        "--heartbeat",
        type=int,
        default=20,
        metavar="SECONDS",
        help="on a database storage a running trial beats this often; one silent for three "
        "beats is failed by the next process that looks (default 20, the same in every process "
        "of a study; 0: off)",
    )
    p.add_argument(
        "--renderer",
        default=DEFAULT_RENDERER,
        help="module:function or file.py:function that renders a Variant to an engine file "
        f"(default {DEFAULT_RENDERER}; tests plant faulty engines with their own)",
    )


def _run_options(p) -> None:
    _target_options(p)
    _study_options(p)
    p.add_argument(
        "--budget-minutes",
        type=float,
        help="wall-clock budget for the whole job (default 20 on a GPU, 5 on a CPU)",
    )
    _search_options(p)
    p.add_argument(
        "--gate",
        choices=("auto", "course", "noise"),
        default="auto",
        help="the correctness gate: course (the grader's allclose against the same-dtype "
        "reference), noise (the error in units of the model dtype's rounding noise), auto "
        "(default: course for the course's float16 target, noise for any other model)",
    )
    p.add_argument(
        "--memory-budget-gib",
        type=float,
        help="the most GPU memory (host memory on a CPU) the grader's pattern may take: a "
        "warm-up engine and two repeats alive at once; an assembly over it is rejected, and the "
        "written engine holds at most a third of it (default 24 for the course's target, whose "
        "grader is an RTX 3090; else this device's memory)",
    )
    p.add_argument(
        "--remeasure",
        type=int,
        default=3,
        help="re-measure this many leaders with the grader's full protocol (default 3; 0: none)",
    )
    p.add_argument(
        "--warm-workers",
        type=int,
        help="on a GPU, compile the queued assemblies' Triton kernels this many at a time before "
        "the first trial (default: half the CPU cores, at most 8, and no more than fit in the "
        "GPU's free memory; 0: off)",
    )
    p.add_argument(
        "--kernel-search",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="on a GPU, after the study, search the chosen engine's decode attention launch at "
        "this model's shapes (a tenth of the budget, at most 5 min; cached per GPU, model and "
        "Triton in studies/kernels/) and keep it where the traces with decode steps run faster "
        "(default: on; --no-kernel-search leaves the rules and the budget to the study)",
    )
    p.add_argument(
        "--neutral-kernels",
        action="store_true",
        help="switch the kernel rules tuned by hand on the H200 off: trials and the kernel "
        "search start from the defaults of a GPU nothing was measured on (a study of its own)",
    )
    p.add_argument("--fresh", action="store_true", help="delete the study and start over")
    p.add_argument("--workspace", default="workspace", help="where engine.py and results.log go")
    p.add_argument(
        "--traces", help=f"comma-separated objective traces (default {','.join(OBJECTIVE_TRACES)})"
    )
    p.add_argument(
        "--no-optuna",
        action="store_true",
        help="skip Optuna: measure the ranked default candidates only (what happens offline)",
    )


def _worker_options(p) -> None:
    _study_options(p, storage_required=True)
    p.add_argument("--model-config", help="model config (default: the study's)")
    p.add_argument("--weight-dir", help="weights (default: the study's)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--budget-minutes", type=float, help="stop after this long (default none)")
    _search_options(p)


def _report_options(p) -> None:
    _study_options(p)
    p.add_argument("--top", type=int, default=5, help="rows in the top table (default 5)")
    p.add_argument("--all", action="store_true", help="also list every trial")
    p.add_argument(
        "--out",
        help="directory for the figures and summary.md (default: next to the study's storage, "
        "studies/<study>/)",
    )
    p.add_argument("--no-plots", action="store_true", help="print the tables only")
    p.add_argument(
        "--sweep",
        help="shape-sweep JSON of `python -m search sweep` to draw (default: sweep.json in "
        "--out, when present)",
    )


def _render_options(p) -> None:
    _study_options(p)
    p.add_argument("--trial", type=int, help="trial number (default: the best)")
    p.add_argument("--output", required=True, help="engine file to write")
    p.add_argument("--renderer", default=DEFAULT_RENDERER, help="module:function")


def _sweep_options(p) -> None:
    _target_options(p)
    _study_options(p)
    importlib.import_module("sweep.command").add_arguments(p)


def _options_of(module: str):
    return lambda p: importlib.import_module(module).add_arguments(p)


# name: (what runs it, "module:function"; its options; its help; its description)
COMMANDS = {
    "run": (
        "search.cli:run",
        _run_options,
        "search, choose, verify and write workspace/engine.py and results.log",
        "The main job: probe this machine, run (or resume) the study, re-measure the leaders like "
        "the grader, write the best engine that passes verification to workspace/engine.py and "
        "explain it in workspace/results.log. Exit 0 only when the written engine passed "
        "verification.",
    ),
    "worker": (
        "search.study:worker",
        _worker_options,
        "run trials for a study in a shared storage",
        "Add trials to a study; several workers on one storage share its trial target. The model "
        "comes from the study unless --model-config/--weight-dir are given.",
    ),
    "report": (
        "search.report:report",
        _report_options,
        "print the top-N table of a study; write its figures and summary.md",
        "Print a study's trials from its storage: counts, the top-N table, the leader's per-trace "
        "numbers and the verified best. Also write PNG figures (trade-off with the Pareto front, "
        "per-axis effects, history, floor efficiency, importances) and summary.md into --out.",
    ),
    "render": (
        "search.report:render",
        _render_options,
        "render one trial's variant to an engine file",
        "Write the standalone engine of a trial (default: the study's verified best, else its "
        "best correct trial).",
    ),
    "sweep": (
        "sweep.command:sweep_command",
        _sweep_options,
        "measure engines over shapes into a JSON file (report draws it)",
        "Build a fresh engine per variant and measure decode step time against batch size (at "
        "one context) and prefill tokens/s against prompt length (one prompt), each with the "
        "floor of evaluator/floor.py's cost model. Variants: --variant (repeat), or the study's "
        "verified best and best distinct correct trials (--study, --top).",
    ),
    "import-gguf": (
        "models.import_gguf:import_gguf_command",
        _options_of("models.import_gguf"),
        "convert a llama.cpp GGUF LLaMA into a Hugging Face folder",
        "Write model.safetensors (dequantized), config.json, tokenizer.json, "
        "tokenizer_config.json and generation_config.json for a GGUF LLaMA file; the folder is "
        "both --model-config DIR/config.json and --weight-dir DIR.",
    ),
    "generate": (
        "serving.generate:generate_command",
        _options_of("serving.generate"),
        "generate text with an engine file and a Hugging Face model folder",
        "Load an engine file as the grader does, prefill the prompts in one call, decode them "
        "together and print each continuation and the tokens/s.",
    ),
    "serve": (
        "serving.serve:serve_command",
        _options_of("serving.serve"),
        "an OpenAI-compatible HTTP server over an engine file, with continuous batching",
        "Serve /v1/completions, /v1/chat/completions (streamed as Server-Sent Events on "
        "request), /v1/models and /health from an engine file and a Hugging Face model folder; "
        "one engine thread batches every live request (docs/SERVING.md).",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level (default INFO)",
    )
    common.add_argument(
        "--debug", action="store_true", help="show the traceback of a user error, not one line"
    )
    parser = argparse.ArgumentParser(
        prog="python -m search",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, options, short, description) in COMMANDS.items():
        options(sub.add_parser(name, parents=[common], help=short, description=description))
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command's exit code: 0 done, 1 its job failed, 2 a user error (one line; the
    traceback with --debug)."""
    from evaluator.engine_loader import EngineLoadError
    from variants.checkpoint.preflight import TargetError

    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    args.command_line = shlex.join(argv)
    module, _, function = COMMANDS[args.command][0].partition(":")
    try:
        return getattr(importlib.import_module(module), function)(args)
    except (UserError, TargetError, EngineLoadError) as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2


# --- the main job: `python -m search run` (what `bash run.sh` does) ------------------------------


def run(args) -> int:
    return RunJob(args).run()


class RunJob:
    """One run's state: `set_up` fills in the device, target, space, budget and runner; the
    search the study and its storage; the later phases read them and add notes for the log."""

    def __init__(self, args):
        self.args = args
        self.start = time.monotonic()
        self.phases: dict[str, float] = {}  # seconds per phase, for the results log
        self.notes: list[str] = []
        self.workspace = Path(args.workspace)
        self.storage_url = self.study_name = self.dashboard = None
        self.study = None

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    @contextmanager
    def phase(self, name: str):
        start = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.monotonic() - start

    def run(self) -> int:
        """The phases in order: set-up, the search, the full-protocol re-measurement of the
        leaders, verify-and-write, a short shape sweep of the leaders for the report's figures,
        the figures and the results log. A study that already holds a verified best and no newer
        trials is not searched again: its best is rendered, re-verified and written in seconds.
        """
        with self.phase("set-up"):
            set_up(self)
        with self.phase("search"):
            records, standing = search_trials(self)
        if standing is None:
            with self.phase("full-protocol re-measure"):
                try:
                    remeasure(self, records)
                except Exception as exc:  # numbers lost, not the engine: go on to write one
                    log.exception("the full-protocol re-measurement failed")
                    self.notes.append(f"the full-protocol re-measurement failed: {exc!r}")
        ranked = rank(records)
        self.kernels = None
        if standing is None and ranked:
            from tuning.phase import kernel_phase

            with self.phase("kernel search"):
                try:
                    self.kernels = kernel_phase(self, ranked[0])
                except Exception as exc:  # the rules stay: an engine is still written
                    log.exception("the kernel search failed")
                    self.notes.append(f"the kernel search failed: {exc!r}")
        tuned = self.kernels.table if self.kernels is not None and self.kernels.kept else None
        with self.phase("verify and write"):
            first = [standing] if standing is not None else []
            numbers = {r.number for r in first}
            rest = [r for r in candidates(self, records, ranked) if r.number not in numbers]
            renderer = load_renderer(self.args.renderer)
            budget, weights = self.runner.engine_budget_gib, self.target.weights_format

            def render(variant, path, text):  # the kernel search's table for its leader alone
                leader = tuned and variant.to_dict() == ranked[0].variant
                knobs = {"knobs": tuned} if leader else {}
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
            attempts = write_verified(
                first + rest, render, self.workspace, verify, partial(header, self)
            )
        done = installed(attempts)
        if done is not None:
            remember(self, done.record)
            log.info("wrote %s: %s", self.workspace / "engine.py", done.record.name)
        else:
            aside = set_aside(self)
            self.notes.append(aside)
        if done is not None and self.study is not None:
            from sweep.command import sweep_leaders

            with self.phase("shape sweep"):
                self.notes += sweep_leaders(self, reuse=standing is not None)
        self.write_figures()
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

    def write_figures(self) -> None:
        """The study report (PNG figures, summary.md) next to the study; never fails the job."""
        if self.study is None:
            return
        try:
            from search.figures import write_report

            out = default_report_dir(self.storage_url, self.study_name, self.args.studies_dir)
            paths = write_report(self.study, out)
            self.notes.append(f"figures and summary in {out}: " + ", ".join(p.name for p in paths))
        except Exception as exc:  # a diagram is not worth the engine
            log.warning("could not write the study figures: %r", exc)
            self.notes.append(f"the study figures could not be written: {exc!r}")


# --- the search phase of the main job ----------------------------------------------------------
# The Optuna study (resumed, its model recorded, known-good assemblies first, their Triton
# kernels compiled side by side on a GPU, then the sampler inside the budget) or, without Optuna,
# the ranked defaults alone. A study whose verified best still stands is not searched again.


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
    job.runner.durations += [
        r.attrs["trial_seconds"]
        for r in records
        if r.status in ("ok", "infeasible") and r.attrs.get("trial_seconds")
    ]
    warmed = warm_queued(job, study)
    if warmed:
        job.notes.append(warmed)
    st.optimize(study, job.space, job.runner, job.budget, n_trials=args.trials)
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
    job.runner.ceilings = measure_ceilings(job.device)
    defaults = ranked_defaults(job.caps)[: job.args.trials or None]
    defaults = [job.space.canonical(v) for v in defaults]
    warmed = warm_first(job, defaults)
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
