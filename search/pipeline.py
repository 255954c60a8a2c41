"""The main job (`python -m search run`): target, probe, study, leaders, verified engine, log.

Phases, in `RunJob.run`: set-up (search.run_setup); the search (search.run_search: Optuna, or the
ranked defaults alone when Optuna is missing); the full-protocol re-measurement of the leaders and
verify-and-write (search.run_write); a short shape sweep of the leaders (search.sweep_leaders) for
the report's figures; the results log. A study that already holds a verified best and no newer
trials is not searched again: its best is rendered, re-verified and written in seconds.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from pathlib import Path

from search.results_log import RunSummary, write_log
from search.run_search import search_trials
from search.run_setup import set_up
from search.run_write import (
    candidates,
    common_failure,
    header,
    remeasure,
    remember,
    set_aside,
    verify,
)
from search.select import installed, rank, write_verified
from search.trial_worker import load_renderer

log = logging.getLogger(__name__)


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


class RunJob:
    """One run's state: `set_up` fills in the device, target, space and runner; the search the
    study and its storage; the later phases read them and add notes for the results log."""

    def __init__(self, args):
        self.args = args
        self.start = time.monotonic()
        self.clock = PhaseClock()
        self.notes: list[str] = []
        self.workspace = Path(args.workspace)
        self.storage_url = self.study_name = self.dashboard = None
        self.study = None

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self) -> int:
        with self.clock("set-up"):
            set_up(self)
        with self.clock("search"):
            records, standing = search_trials(self)
        if standing is None:
            with self.clock("full-protocol re-measure"):
                try:
                    remeasure(self, records)
                except Exception as exc:  # numbers lost, not the engine: go on to write one
                    log.exception("the full-protocol re-measurement failed")
                    self.notes.append(f"the full-protocol re-measurement failed: {exc!r}")
        ranked = rank(records)
        with self.clock("verify and write"):
            first = [standing] if standing is not None else []
            rest = [
                r
                for r in candidates(self, records, ranked)
                if r.number not in {f.number for f in first}
            ]
            render = load_renderer(self.args.renderer)
            budget, weights = self.runner.engine_budget_gib, self.target.weights_format
            attempts = write_verified(
                first + rest,
                lambda variant, path, text: render(variant, path, text, budget, weights=weights),
                self.workspace,
                verify(self, benchmark=standing is None),
                lambda record: header(self, record),
            )
        done = installed(attempts)
        if done is not None:
            remember(self, done.record)
            log.info("wrote %s: %s", self.workspace / "engine.py", done.record.name)
        else:
            aside = set_aside(self)
            self.notes.append(aside)
        if done is not None and self.study is not None:
            from search.sweep_leaders import sweep_leaders

            with self.clock("shape sweep"):
                self.notes += sweep_leaders(self, reuse=standing is not None)
        self.write_figures()
        self.clock.phases["total"] = time.monotonic() - self.start
        self.write_log(records, ranked, attempts)
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
            from search.summary_md import default_report_dir, write_report

            out = default_report_dir(self.storage_url, self.study_name, self.args.studies_dir)
            paths = write_report(self.study, out)
            self.notes.append(f"figures and summary in {out}: " + ", ".join(p.name for p in paths))
        except Exception as exc:  # a diagram is not worth the engine
            log.warning("could not write the study figures: %r", exc)
            self.notes.append(f"the study figures could not be written: {exc!r}")

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


def run(args) -> int:
    return RunJob(args).run()
