"""The trial runner: one variant, one child process, one time limit.

The child (`search.trial_worker`) renders, imports, gates and times the engine; a crash, a hang
(the whole process group is killed at the limit) or an out-of-memory error cannot take the study
down with it. The outcome is flat numbers ready to be Optuna user attributes.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from search.records import finite, geometric_mean
from search.trial_worker import DEFAULT_RENDERER, OBJECTIVE_TRACES, TOL_SHARE_LIMIT

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
TAIL_CHARS = 2000
# A crude but safe fallback when the correctness gate reports no tol_share.
INFEASIBLE = 1.0e6


@dataclass
class TrialOutcome:
    status: str  # ok | infeasible | failed
    attrs: dict
    values: tuple[float, float] | None = None
    reason: str | None = None
    seconds: float = 0.0

    @property
    def constraint(self) -> float:
        """<= 0 when the engine is correct with margin (Optuna's convention)."""
        return self.attrs["constraint"][0]


def tail(path: Path, chars: int = TAIL_CHARS) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-chars:].strip()


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_child(cmd: list[str], log_path: Path, timeout_s: float) -> tuple[int | None, float]:
    """Run `cmd` in its own session; kill its process group at the limit. (returncode or None
    on a timeout, seconds)."""
    start = time.perf_counter()
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            env=child_env(),
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            kill_group(proc)
            code = None
    return code, time.perf_counter() - start


def kill_group(proc: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


@dataclass
class TrialRunner:
    config: dict
    weight_dir: str
    device: str
    renderer: str = DEFAULT_RENDERER
    traces: tuple[str, ...] = OBJECTIVE_TRACES
    timeout_s: float = 300.0
    atol: float = 1e-2
    rtol: float = 1e-2
    tol_share_limit: float = TOL_SHARE_LIMIT
    gate_cases: tuple[str, ...] = ("public", "stress")
    gate: dict | None = None  # the correctness gate as JSON (evaluator.gate_choice); None: course
    ceilings: dict | None = None
    # the peak an assembly may reach in the grader's pattern (None: no bound), and the budget
    # of one engine written into its file (MEMORY_BUDGET_GIB)
    memory_budget_mib: float | None = None
    engine_budget_gib: float | None = None
    python: str = sys.executable
    durations: list[float] = field(default_factory=list)

    def run(self, variant, protocol: str = "quick", check: bool = True, timeout_s=None):
        """Evaluate `variant` (a Variant) in a child process; never raises for engine faults."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        with tempfile.TemporaryDirectory(prefix="trial-") as tmp:
            tmp = Path(tmp)
            code, seconds = run_child(
                self.command(variant, tmp, protocol, check), tmp / "log.txt", limit
            )
            result = self._result(tmp / "result.json", code, limit, tmp / "log.txt")
            if protocol == "quick" and result["status"] != "failed":
                self.durations.append(seconds)  # crashes and timeouts say nothing typical
        outcome = outcome_from_result(result, variant, self, protocol)
        outcome.seconds = seconds
        outcome.attrs["trial_seconds"] = round(seconds, 3)
        return outcome

    def command(self, variant, tmp: Path, protocol="quick", check=True, traces=None) -> list[str]:
        """The worker's command line for `variant`, its job written to `tmp/job.json`; the
        engine, the result (`tmp/result.json`) and its phase marker go to `tmp` too."""
        job = {
            "variant": variant.to_dict(),
            "config": self.config,
            "weight_dir": str(self.weight_dir),
            "device": self.device,
            "renderer": self.renderer,
            "traces": list(self.traces if traces is None else traces),
            "protocol": protocol,
            "check": check,
            "atol": self.atol,
            "rtol": self.rtol,
            "tol_share_limit": self.tol_share_limit,
            "gate_cases": list(self.gate_cases),
            "gate": self.gate,
            "ceilings": self.ceilings,
            "memory_budget_mib": self.memory_budget_mib,
            "engine_budget_gib": self.engine_budget_gib,
            "engine_path": str(tmp / "engine.py"),
            "output": str(tmp / "result.json"),
        }
        (tmp / "job.json").write_text(json.dumps(job))
        return [self.python, "-m", "search.trial_worker", str(tmp / "job.json")]

    def _result(self, output: Path, code, limit: float, log_path: Path) -> dict:
        if output.is_file():
            result = json.loads(output.read_text())
            if result["status"] == "failed":
                result["reason"] = f"{result.get('reason')}\n{tail(log_path)}".strip()
            return result
        phase = Path(str(output) + ".phase")
        where = phase.read_text() if phase.is_file() else "start-up"
        if code is None:
            reason = f"timed out after {limit:.0f} s during {where}"
            if limit < self.timeout_s:  # the budget's last seconds: no verdict on the variant
                reason += (
                    f" (cut short by the search budget: a trial may take {self.timeout_s:.0f} s"
                    ", so this says nothing about the variant)"
                )
        else:
            reason = f"process died (exit code {code}) during {where}"
        return {
            "status": "failed",
            "reason": f"{reason}\n{tail(log_path)}".strip(),
            "timeout": code is None,
        }


def outcome_from_result(result: dict, variant, runner: TrialRunner, protocol: str) -> TrialOutcome:
    """Flatten a worker result into user attributes, objective values and the constraint."""
    attrs: dict = {
        "variant": variant.to_dict(),
        "variant_name": variant.name,
        "status": result["status"],
        "protocol": protocol,
        "atol": runner.atol,
        "rtol": runner.rtol,
    }
    if result.get("reason"):
        attrs["reason"] = result["reason"]
    if result.get("timeout"):
        attrs["timed_out"] = True
    if "check" in result:
        attrs["max_abs_err"] = result["max_abs_err"]
        attrs["tol_share"] = result["tol_share"]
        attrs["noise_share"] = result.get("noise_share")
        attrs["gate"] = result.get("gate", "course")
        attrs["check"] = {
            case: {k: c[k] for k in ("passed", "max_abs_err", "tol_share", "steps", "failure")}
            for case, c in result["check"].items()
        }
    attrs["constraint"] = [constraint(result, runner.tol_share_limit)]
    values = None
    prefix = "full_" if protocol == "full" else ""
    if result.get("grader_peak_mib") is not None:
        attrs[f"{prefix}grader_peak_mib"] = result["grader_peak_mib"]
    if result["status"] == "ok" and result.get("traces"):
        attrs.update(trace_attrs(result["traces"], prefix))
        if f"{prefix}grader_peak_mib" in attrs:  # the memory objective: the grader's pattern
            attrs[f"{prefix}engine_peak_mib"] = attrs[f"{prefix}peak_mib"]
            attrs[f"{prefix}peak_mib"] = attrs[f"{prefix}grader_peak_mib"]
        values = (attrs[f"{prefix}tokens_per_s"], attrs[f"{prefix}peak_mib"])
    elif result["status"] == "infeasible":
        # the worst on both objectives: no Pareto front (the dashboard's ignores constraints)
        # lists a wrong engine as a best trial
        values = (0.0, float("inf"))
    return TrialOutcome(result["status"], finite(attrs), values, result.get("reason"))


def constraint(result: dict, limit: float) -> float:
    """The gate's share minus its limit (<= 0: correct with margin): the share of the tolerance
    against `limit` under the course's gate, the noise share against 1 under the noise gate
    (its multiple holds the margin). A wrong answer of another kind (shape, dtype, aliased
    output) is infeasible whatever its share."""
    if result.get("gate") == "noise":
        share, limit = result.get("noise_share"), 1.0
    else:
        share = result.get("tol_share")
    value = min(float(share), INFEASIBLE) - limit if share is not None else INFEASIBLE
    if result["status"] != "ok" and value <= 0:
        value = 1.0
    return value


def trace_attrs(traces: dict[str, dict], prefix: str = "") -> dict:
    """Per-trace numbers and the two objectives: geometric-mean tokens/s and peak MiB."""
    attrs: dict = {}
    for name, t in traces.items():
        attrs[f"{prefix}tps_{name}"] = t["tokens_per_s"]
        attrs[f"{prefix}decode_tps_{name}"] = t["decode_tokens_per_s"]
        attrs[f"{prefix}seconds_{name}"] = t["seconds"]
        if t.get("floor_eff") is not None:
            attrs[f"{prefix}floor_eff_{name}"] = t["floor_eff"]
    attrs[f"{prefix}tokens_per_s"] = geometric_mean([t["tokens_per_s"] for t in traces.values()])
    attrs[f"{prefix}peak_mib"] = max(t["peak_mib"] for t in traces.values())
    attrs[f"{prefix}create_s"] = max(t["create_s"] for t in traces.values())
    attrs[f"{prefix}peak_kind"] = next(iter(traces.values())).get("peak_kind")
    return attrs
