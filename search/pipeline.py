"""The main job (`python -m search run`): target, probe, study, leaders, verified engine, log.

Phases: set-up; the search (Optuna, or the ranked defaults alone when Optuna is missing); the
full-protocol re-measurement of the leaders; verify-and-write; a short shape sweep of the leaders
(search.sweep_command) for the report's figures; the results log. A study that already holds a
verified best and no newer trials is not searched again: its best is rendered, re-verified and
written in seconds.
"""

from __future__ import annotations

import hashlib
import logging
import time
from contextlib import contextmanager
from pathlib import Path

from search.environment import describe_environment
from search.records import Record
from search.results_log import RunSummary, write_log
from search.select import installed, rank, remeasure_leaders, verify_engine, write_verified
from search.space import SearchSpace
from search.target import resolve_target
from search.trial import TrialRunner
from search.trial_worker import CPU_OBJECTIVE_TRACES, OBJECTIVE_TRACES, load_renderer
from variants.presets import ranked_defaults
from variants.probe import probe_capabilities
from variants.variant import Variant

log = logging.getLogger(__name__)

DEFAULT_BUDGET_MIN = {"cuda": 20.0, "cpu": 5.0}
DEFAULT_TRIAL_TIMEOUT_S = {"cuda": 300.0, "cpu": 180.0}


def resolve_device(text: str) -> str:
    import torch

    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind = torch.device(text).type
    if kind == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"error: --device {text}, but torch sees no CUDA device")
    if kind not in ("cuda", "cpu"):
        raise SystemExit(f"error: --device must be auto, cpu or cuda[:N], got {text!r}")
    return text


def measure_ceilings(device: str) -> dict | None:
    try:
        from evaluator.floor import measure_ceilings as measure

        return measure(device).to_dict()
    except Exception as exc:  # floor efficiency is a diagnostic
        log.warning("could not measure the device ceilings: %s", exc)
        return None


class PhaseClock:
    def __init__(self):
        self.phases: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        start = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.monotonic() - start


def optuna_available() -> bool:
    try:
        import optuna  # noqa: F401
    except ImportError:
        return False
    return True


class RunJob:
    def __init__(self, args):
        self.args = args
        self.start = time.monotonic()
        self.clock = PhaseClock()
        self.notes: list[str] = []
        self.workspace = Path(args.workspace)
        self.storage_url = self.study_name = self.dashboard = None
        self.study = None

    # --- set-up -----------------------------------------------------------------------------

    def setup(self) -> None:
        args = self.args
        self.device = resolve_device(args.device)
        kind = "cuda" if self.device.startswith("cuda") else "cpu"
        self.target = resolve_target(args.model_config, args.weight_dir)
        self.caps = probe_capabilities(self.device, self.target.config)
        self.space = SearchSpace(self.caps)
        minutes = args.budget_minutes if args.budget_minutes else DEFAULT_BUDGET_MIN[kind]
        self.budget_s = 60 * minutes
        self.deadline = self.start + self.budget_s
        self.trial_timeout = args.trial_timeout or DEFAULT_TRIAL_TIMEOUT_S[kind]
        self.notes.append(f"budget {minutes:g} min, trial limit {self.trial_timeout:.0f} s")
        self.environment = describe_environment(self.device)
        self.runner = TrialRunner(
            self.target.config,
            str(self.target.weight_dir),
            self.device,
            renderer=args.renderer,
            traces=self.objective_traces(kind),
            timeout_s=self.trial_timeout,
        )
        log.info(
            "target %s on %s; %d assemblies in the space",
            self.target.config_path,
            self.device,
            self.space.size,
        )

    def objective_traces(self, kind: str) -> tuple[str, ...]:
        if self.args.traces:
            return tuple(t.strip() for t in self.args.traces.split(",") if t.strip())
        if kind == "cpu":
            self.notes.append(
                "CPU: the objective times " + ", ".join(CPU_OBJECTIVE_TRACES) + " (the continuous"
                " trace takes too long per trial on a CPU; add it with --traces)"
            )
            return CPU_OBJECTIVE_TRACES
        return OBJECTIVE_TRACES

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    # --- the search -------------------------------------------------------------------------

    def search_with_optuna(self) -> tuple[list[Record], Record | None]:
        """Records of the study, and the verified best when it stands (no search was needed)."""
        from search import study as st
        from search.optimize import Budget, enqueue_known_good, optimize

        args = self.args
        name = args.study or st.study_name(self.target.config, self.caps)
        url = args.storage or st.default_storage_url(name, args.studies_dir)
        self.storage_url, self.study_name, self.dashboard = url, name, st.dashboard_command(url)
        storage = st.open_storage(url)
        study = self.study = st.open_study(storage, name, fresh=args.fresh, seed=args.seed)
        st.fail_stale_trials(study, older_than_s=2 * self.trial_timeout + 120)
        records = st.load_records(study)
        best = self.standing_best(study, records)
        if best is not None:
            self.notes.append(
                f"resumed study {name}: its verified best (trial {best.number}) stands; "
                "no new trials were run, the best was re-rendered and re-verified"
            )
            return records, best
        self.runner.ceilings = study.user_attrs.get("ceilings") or measure_ceilings(self.device)
        self.prepare_study(study)
        hardware = st.hardware_key(self.caps)
        studies_dir = Path(args.studies_dir) if args.storage is None else None
        queued = enqueue_known_good(
            study, self.space, self.caps, storage, name, hardware, studies_dir
        )
        if queued:
            self.notes.append("enqueued first: " + "; ".join(queued))
        elif records:
            self.notes.append(f"resumed study {name} with {len(records)} earlier trial(s)")
        self.runner.durations += [
            r.attrs["trial_seconds"]
            for r in records
            if r.status in ("ok", "infeasible") and r.attrs.get("trial_seconds")
        ]
        budget = Budget(self.deadline, self.trial_timeout, total_s=self.budget_s)
        optimize(study, self.space, self.runner, budget, n_trials=args.trials)
        return st.load_records(study), None

    def prepare_study(self, study) -> None:
        from search.study import hardware_key

        attrs = {
            "model_config": self.target.config,
            "model_config_path": str(self.target.config_path),
            "weight_dir": str(self.target.weight_dir),
            "hardware": hardware_key(self.caps),
            "capabilities": self.caps.to_dict(),
            "space": {name: list(choices) for name, choices in self.space.describe()},
            "traces": list(self.runner.traces),
            "objectives": "maximize geometric-mean tokens/s over the traces; minimize peak MiB",
            "ceilings": self.runner.ceilings,
        }
        for key, value in attrs.items():
            if study.user_attrs.get(key) != value:
                study.set_user_attr(key, value)

    def standing_best(self, study, records: list[Record]) -> Record | None:
        from search.study import started_trials

        best = study.user_attrs.get("verified_best")
        if not best or best["trial"] < 0 or self.args.fresh:
            return None  # none, or an unmeasured default written when every trial failed
        started = len(started_trials(study))
        if best.get("n_trials") != started or (self.args.trials or 0) > started:
            return None  # newer trials (other workers), or more trials asked for
        variant = Variant.from_dict(best["variant"])
        if self.caps.why_invalid(variant) is not None:
            return None
        for r in records:
            if r.number == best["trial"]:
                return r
        return Record(best["trial"], "ok", best["variant"], {"variant_name": variant.name})

    def search_defaults(self) -> list[Record]:
        """No Optuna: the ranked defaults, each in its own process, inside the budget."""
        from search.optimize import Budget

        self.runner.ceilings = measure_ceilings(self.device)
        budget = Budget(self.deadline, self.trial_timeout, total_s=self.budget_s)
        defaults = ranked_defaults(self.caps)[: self.args.trials or None]
        records = []
        for number, variant in enumerate(defaults):
            limit = budget.time_for_trial(self.runner.durations)
            if limit is None:
                break
            variant = self.space.canonical(variant)
            outcome = self.runner.run(variant, timeout_s=limit)
            log.info("default %d %s: %s", number, variant.name, outcome.status)
            records.append(
                Record(number, outcome.status, variant.to_dict(), outcome.attrs, outcome.values)
            )
        return records

    # --- choosing and writing ---------------------------------------------------------------

    def remeasure(self, records: list[Record]) -> None:
        measured = remeasure_leaders(records, self.runner, self.args.remeasure, self.seconds_left)
        for r in records:
            r.attrs.update(measured.get(r.number, {}))
        if measured and self.study is not None:
            from search.study import update_study_attr

            update_study_attr(self.study, "full_protocol", {str(n): a for n, a in measured.items()})

    def candidates(self, records: list[Record], ranked: list[Record]) -> list[Record]:
        """Ranked trials, then defaults never shown wrong (so some engine is always written)."""
        tried = {repr(sorted(r.variant.items())) for r in records if r.variant and _ruled_out(r)}
        tried |= {repr(sorted(r.variant.items())) for r in ranked}
        extra = []
        for i, v in enumerate(ranked_defaults(self.caps)):
            v = self.space.canonical(v)
            if repr(sorted(v.to_dict().items())) not in tried:
                attrs = {"variant_name": v.name, "source": "ranked default, not measured"}
                extra.append(Record(-1 - i, "fallback", v.to_dict(), attrs))
        return ranked + extra

    def header(self, record: Record) -> str:
        lines = [
            "Written by `bash run.sh` (python -m search run), "
            + time.strftime("%Y-%m-%d %H:%M:%S"),
            f"variant: {record.name}",
        ]
        if record.number >= 0:
            where = f"study {self.study_name}, " if self.study_name else ""
            lines.append(
                f"{where}trial {record.number}: {record.tokens_per_s:.1f} tokens/s (geometric "
                f"mean of {', '.join(self.runner.traces)}), peak {record.peak_mib:.0f} MiB"
            )
        return "\n".join(lines)

    def verify(self, benchmark: bool):
        def run(path: Path):
            return verify_engine(
                path,
                self.target.config_path,
                self.target.weight_dir,
                self.device,
                timeout_s=max(600.0, 4 * self.trial_timeout),
                benchmark=benchmark,
            )

        return run

    def remember(self, record: Record) -> None:
        if self.study is None:
            return
        from search.study import started_trials

        digest = hashlib.sha256((self.workspace / "engine.py").read_bytes()).hexdigest()
        self.study.set_user_attr(
            "verified_best",
            {
                "trial": record.number,
                "variant": record.variant,
                "variant_name": record.name,
                "tokens_per_s": record.tokens_per_s,
                "peak_mib": record.peak_mib,
                "n_trials": len(started_trials(self.study)),
                "engine_sha256": digest,
                "verified_at": time.strftime("%Y-%m-%d %H:%M:%S"),
            },
        )

    # --- the whole job ----------------------------------------------------------------------

    def run(self) -> int:
        with self.clock("set-up"):
            self.setup()
        with self.clock("search"):
            records, standing = self.search()
        if standing is None:
            with self.clock("full-protocol re-measure"):
                try:
                    self.remeasure(records)
                except Exception as exc:  # numbers lost, not the engine: go on to write one
                    log.exception("the full-protocol re-measurement failed")
                    self.notes.append(f"the full-protocol re-measurement failed: {exc!r}")
        ranked = rank(records)
        with self.clock("verify and write"):
            first = [standing] if standing is not None else []
            rest = [
                r
                for r in self.candidates(records, ranked)
                if r.number not in {f.number for f in first}
            ]
            attempts = write_verified(
                first + rest,
                load_renderer(self.args.renderer),
                self.workspace,
                self.verify(benchmark=standing is None),
                self.header,
            )
        done = installed(attempts)
        if done is not None:
            self.remember(done.record)
            log.info("wrote %s: %s", self.workspace / "engine.py", done.record.name)
        else:
            log.error("no candidate passed verification; %s left as it was", self.workspace)
        if done is not None and self.study is not None:
            from search.sweep_command import sweep_leaders

            with self.clock("shape sweep"):
                self.notes += sweep_leaders(self, reuse=standing is not None)
        self.write_figures()
        self.clock.phases["total"] = time.monotonic() - self.start
        self.write_log(records, ranked, attempts)
        return 0 if done is not None else 1

    def write_figures(self) -> None:
        """The study report (PNG figures, summary.md) next to the study; never fails the job."""
        if self.study is None:
            return
        try:
            from search.summary_md import default_report_dir, write_report

            out = default_report_dir(self.storage_url, self.study_name)
            paths = write_report(self.study, out)
            self.notes.append(f"figures and summary in {out}: " + ", ".join(p.name for p in paths))
        except Exception as exc:  # a diagram is not worth the engine
            log.warning("could not write the study figures: %r", exc)
            self.notes.append(f"the study figures could not be written: {exc!r}")

    def search(self) -> tuple[list[Record], Record | None]:
        """The study (or the defaults alone); if the machinery itself breaks, whatever trials
        finished, so that an engine is still verified and written."""
        try:
            if self.args.no_optuna or not optuna_available():
                why = "--no-optuna" if self.args.no_optuna else "Optuna cannot be imported"
                self.notes.append(f"{why}: evaluated the ranked default candidates only")
                log.warning("%s: evaluating the ranked default candidates only", why)
                return self.search_defaults(), None
            return self.search_with_optuna()
        except Exception as exc:
            log.exception("the search failed; writing the best verified candidate found so far")
            self.notes.append(f"the search failed ({exc!r}); candidates: the trials so far")
            try:
                from search.study import load_records

                return (load_records(self.study) if self.study is not None else []), None
            except Exception:
                return [], None

    def write_log(self, records, ranked, attempts) -> None:
        summary = RunSummary(
            command="python -m search " + self.args.command_line,
            environment=self.environment,
            target=self.target.describe(),
            capabilities=self.caps.to_dict(),
            space=self.space.describe(),
            space_size=self.space.size,
            records=records,
            ranked=ranked,
            attempts=attempts,
            phases=self.clock.phases,
            storage=self.storage_url,
            study=self.study_name,
            dashboard=self.dashboard,
            notes=self.notes + self.target.notes,
        )
        write_log(self.workspace / "results.log", summary)
        log.info("wrote %s", self.workspace / "results.log")


def _ruled_out(record: Record) -> bool:
    """Shown wrong, or crashed for a reason other than running out of time."""
    return record.status == "infeasible" or (
        record.status == "failed" and not record.attrs.get("timed_out")
    )


def run(args) -> int:
    return RunJob(args).run()
