"""One trial: a variant rendered, imported, gated and timed in a child process of its own
session, killed at its time limit (`TrialRunner`; the child is `main`), so that no crash, hang or
out-of-memory error takes the study down; and a trial as plain data (`Record`). The outcome is
flat numbers ready to be Optuna user attributes (`tokens_per_s`, `tps_<trace>`, `full_*`, ...);
nothing here needs Optuna."""

from __future__ import annotations

import gc
import hashlib
import importlib
import importlib.util
import json
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path

log = logging.getLogger("search.trial")  # (the child runs as __main__)

# the public benchmark and the serving trace closest to the grader's load
OBJECTIVE_TRACES = ("prefill", "decode", "mixed", "continuous")
CPU_OBJECTIVE_TRACES = ("prefill", "decode", "mixed")
DEFAULT_RENDERER = "variants.render:render_engine"
# the most of the tolerance a trial may use: one passing by a hair may fail the hidden cases
TOL_SHARE_LIMIT = 0.5
REPO_ROOT = Path(__file__).resolve().parent.parent
# A screened trial stops (pruned) at the first trace it runs under this share of the best
# trial's speed there: to win the geometric mean, its other three would need 1.6x the best's.
# (Optuna's pruners cannot: Trial.report and should_prune raise NotImplementedError in a
# multi-objective study, and ours is two: tokens/s and peak memory.)
PRUNE_SHARE = 0.25
INFEASIBLE = 1.0e6  # the constraint of a result that reports no share of the tolerance
# The source of an assembly the search queues in place of the sampler's copy of one already run:
# the search's proposal, not a known-good one (presets, earlier studies' bests).
NEAREST = "untried, nearest the leader"
# The correctness gate's verdict as a child's result holds it: a warm-up child's, taken by the
# trial whose engine file is the same, byte for byte (`TrialRunner.keep_verdict`)
VERDICT = ("status", "reason", "check", "gate", "max_abs_err", "tol_share", "noise_share")
# What a warm-up child stopped while a trial times may still have running on the GPU: the
# kernels it queued before the stop, about one engine call's (its gate reads each call's
# logits back before the next call)
HELD_SETTLE_S = 0.05


@dataclass
class Record:
    """`status`: ok (correct, measured), infeasible (wrong, or too close to the tolerance), failed
    (crashed, hung, out of memory), duplicate (same variant as an earlier trial), skipped (over
    a shared trial target), running, waiting (queued), fallback (a default never measured)."""

    number: int
    status: str
    variant: dict | None
    attrs: dict = field(default_factory=dict)
    values: tuple[float, ...] | None = None

    @property
    def feasible(self) -> bool:
        if self.status not in ("ok", "duplicate") or self.values is None:
            return False
        return all(c <= 0 for c in self.attrs.get("constraint") or [1.0])

    @property
    def has_full(self) -> bool:
        return self.attrs.get("full_tokens_per_s") is not None

    @property
    def tokens_per_s(self) -> float:
        """Full-protocol throughput when measured, else the screening number."""
        return float(self.attrs.get("full_tokens_per_s" if self.has_full else "tokens_per_s") or 0)

    @property
    def screening_tokens_per_s(self) -> float:
        """The screening (quick protocol) throughput, which every measured trial has."""
        return float(self.attrs.get("tokens_per_s") or 0.0)

    @property
    def peak_mib(self) -> float:
        return float(self.attrs.get("full_peak_mib" if self.has_full else "peak_mib") or 0.0)

    @property
    def name(self) -> str:
        return self.attrs.get("variant_name") or "?"

    def trace_numbers(self, prefix: str = "") -> dict[str, dict]:
        """Per trace `{tps, decode_tps, floor_eff, seconds}` (`prefix="full_"`: the full's)."""
        rows: dict[str, dict] = {}
        for key, value in self.attrs.items():
            for kind in ("decode_tps", "tps", "floor_eff", "seconds"):
                head = f"{prefix}{kind}_"
                if key.startswith(head):
                    rows.setdefault(key[len(head) :], {})[kind] = value
        return rows


def finite(value):
    """JSON-safe: non-finite floats become None (storages and the dashboard choke on them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def geometric_mean(values: list[float]) -> float:
    if not values or min(values) <= 0:
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))


def assembly_key(variant) -> str:
    return json.dumps(variant.to_dict(), sort_keys=True)


def engine_digest(path) -> str:
    """The SHA-256 of a rendered engine file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_atomic(path: Path, text: str) -> None:
    """Through a temporary file and a rename: a reader sees all or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# --- the parent: one variant, one child process, one time limit --------------------------------


@dataclass
class TrialOutcome:
    status: str  # ok | infeasible | failed
    attrs: dict
    values: tuple[float, float] | None = None
    reason: str | None = None

    @property
    def constraint(self) -> float:
        """<= 0 when the engine is correct with margin (Optuna's convention)."""
        return self.attrs["constraint"][0]


def tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:].strip()
    except OSError:
        return ""


def run_child(
    cmd: list[str], log_path: Path, timeout_s: float, started=None
) -> tuple[int | None, float]:
    """Run `cmd` from the repository root in its own session; kill its process group at the
    limit. `started(pid)` is called once it runs (its pid is its process group's).
    (returncode, or None on a timeout; seconds)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    start = time.perf_counter()
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            env=env,
            start_new_session=True,
        )
        if started is not None:
            started(proc.pid)
        try:
            code = proc.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            code = None
            for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=grace)
                    break
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue
    return code, time.perf_counter() - start


# What a trial's process imports before its job: a forkserver that has them forks each trial
# (tens of ms) where a fresh interpreter importing torch took seconds. Nothing here touches CUDA,
# so each forked trial still starts its own context.
PRELOAD = ("torch", "evaluator.correctness", "evaluator.benchmark", "variants.render")
_forkserver = None


def forkserver():
    global _forkserver
    if _forkserver is None:
        import multiprocessing

        _forkserver = multiprocessing.get_context("forkserver")
        preload = ["search.trial", *PRELOAD]
        if importlib.util.find_spec("triton") is not None:
            preload.append("triton")
        _forkserver.set_forkserver_preload(preload)
    return _forkserver


def run_trial_child(job_path: Path, log_path: Path, timeout_s: float):
    """`python -m search.trial JOB.json` as `run_child` runs it (its own session, its output in
    `log_path`, its group killed at the limit), forked from the preloaded forkserver.
    (returncode, or None on a timeout; seconds)."""
    start = time.perf_counter()
    proc = forkserver().Process(target=_trial_process, args=(str(job_path), str(log_path)))
    proc.start()
    proc.join(max(timeout_s, 1.0))
    code = proc.exitcode
    if code is None:
        for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:  # (killed before it made its session)
                proc.kill()
            proc.join(grace)
            if proc.exitcode is not None:
                break
    return code, time.perf_counter() - start


def _trial_process(job_path: str, log_path: str) -> None:
    # The forkserver hands each child the parent's end of the pipe it watches for the parent's
    # death: held here, a killed parent would leave the server and this trial running.
    from multiprocessing import forkserver as server

    alive = getattr(server._forkserver, "_forkserver_alive_fd", None)
    if alive is not None:
        os.close(alive)
        server._forkserver._forkserver_alive_fd = None
    os.setsid()
    os.chdir(REPO_ROOT)
    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    stop_with_parent()
    exit_on_term()
    exit_child(main([job_path]))


def exit_child(code: int) -> None:
    """A forked trial's exit: output flushed, multiprocessing's finalizers run (a compile's
    worker pool leaves semaphores with the resource tracker the trials share, which warns at
    the job's end of every one not unlinked), then out without the parent's atexit handlers."""
    from multiprocessing import util

    sys.stdout.flush()
    sys.stderr.flush()
    util._run_finalizers(0)
    os._exit(code)


def exit_on_term() -> None:
    """A trial stopped at its limit (SIGTERM, then SIGKILL after a grace) exits as `exit_child`
    does: without it, the semaphores a compile's worker pool left are reported as leaked at the
    job's end."""
    signal.signal(signal.SIGTERM, lambda signum, frame: exit_child(128 + signum))


# the parent's, not the child's
NOT_IN_JOB = ("timeout_s", "durations", "screened", "verdicts")


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
    # the decode attention's launch: a table the kernel search found (tuning/decode_attention.py,
    # as JSON), else the hand rules or, "neutral", the defaults of a GPU nothing was measured on
    knobs: dict | None = None
    kernel_prior: str = "hand"
    # the few-row kernels' launches the kernel search found (tuning/few_row.py, as JSON)
    few_row_knobs: dict | None = None
    # the prefill attention's tiles it found (tuning/prefill_attention.py, as JSON)
    prefill_knobs: dict | None = None
    # where the gate's noise measurement is kept for the next trials (None: each measures it)
    noise_cache: str | None = None
    durations: list[float] = field(default_factory=list)
    screened: list[float] = field(default_factory=list)  # (pruned trials too)
    # The gate's verdicts warm-up children reached (search/warmup.py), by assembly, each with
    # its engine file's digest. (A trial that takes one times its engine while the children
    # warm the next trials' beside its builds: on the GPU its seconds stay about a trial's
    # that ran the gate, and the reserves after the search count in them: docs/PERF.md.)
    verdicts: dict = field(default_factory=dict)

    def keep_verdict(self, variant, result: dict) -> bool:
        """Keep the gate's verdict in a warm-up child's `result` for `variant`'s trial: one the
        gate reached to its end (ok, or wrong: infeasible), never a crash or a cut. The trial
        takes it where the file it renders is the one the child checked (`run_job`)."""
        if result.get("status") not in ("ok", "infeasible") or "check" not in result:
            return False
        if not result.get("engine_sha256"):
            return False
        verdict = {key: result.get(key) for key in VERDICT}
        verdict["engine_sha256"] = result["engine_sha256"]
        self.verdicts[assembly_key(variant)] = verdict
        return True

    def keep_references(self) -> float:
        """The gate's references computed once, here, into `noise_cache` before any child runs:
        the children read them there (warm-up children side by side each measured them, with
        a float32 copy of the model in the GPU's memory). Its seconds."""
        start = time.perf_counter()
        if self.noise_cache is not None:
            job = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in NOT_IN_JOB}
            _, prepared = prepare_gate(job)
            prepared.judges.fill()
            prepared.judges.keep()
            del prepared
            if self.device.startswith("cuda"):
                import torch

                torch.cuda.empty_cache()
        return time.perf_counter() - start

    def run(
        self,
        variant,
        protocol="quick",
        check=True,
        timeout_s=None,
        prune_below=None,
        paused=(),
    ) -> TrialOutcome:
        """Evaluate `variant` (a Variant) in a child process; never raises for engine faults.
        `prune_below`: trace -> tokens/s under which the timing stops there (`PRUNE_SHARE`);
        `paused`: process groups the child stops while it times (`held`)."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        verdict = self.verdicts.get(assembly_key(variant)) if check else None
        with tempfile.TemporaryDirectory(prefix="trial-") as tmp:
            tmp = Path(tmp)
            self.command(
                variant, tmp, protocol, check, prune_below=prune_below, paused=paused,
                verdict=verdict,
            )  # fmt: skip
            code, seconds = run_trial_child(tmp / "job.json", tmp / "log.txt", limit)
            result = self._result(tmp / "result.json", code, limit, tmp / "log.txt")
            if protocol == "quick" and result["status"] != "failed":
                self.screened.append(seconds)
                if result["status"] != "pruned":
                    self.durations.append(seconds)  # crashes, timeouts and prunes: not typical
        outcome = outcome_from_result(result, variant, self, protocol)
        outcome.attrs["trial_seconds"] = round(seconds, 3)
        if result.get("phase_seconds"):  # start-up: the interpreter's too, before `main`
            phases = dict(result["phase_seconds"])
            before = max(0.0, seconds - result.get("worker_seconds", seconds))
            phases["start-up"] = round(phases.get("start-up", 0.0) + before, 3)
            outcome.attrs["phase_seconds"] = phases
        return outcome

    def command(
        self,
        variant,
        tmp: Path,
        protocol="quick",
        check=True,
        traces=None,
        prune_below=None,
        paused=(),
        verdict=None,
    ) -> list[str]:
        """The child's command line for `variant`, its job written to `tmp/job.json`; the
        engine, the result (`tmp/result.json`) and its phase marker go to `tmp` too. `verdict`:
        the gate's verdict a warm-up child reached on the engine file (`keep_verdict`)."""
        job = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in NOT_IN_JOB}
        job.update(variant=variant.to_dict(), protocol=protocol, check=check)
        if verdict is not None:
            job.update(checked=verdict)
        job.update(prune_below=prune_below or {}, pause_groups=list(paused))
        job.update(engine_path=str(tmp / "engine.py"), output=str(tmp / "result.json"))
        job.update(
            weight_dir=str(self.weight_dir), traces=self.traces if traces is None else traces
        )
        (tmp / "job.json").write_text(json.dumps(job))
        return [sys.executable, "-m", "search.trial", str(tmp / "job.json")]

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
        reason = f"{reason}\n{tail(log_path)}".strip()
        return {"status": "failed", "reason": reason, "timeout": code is None}


def outcome_from_result(result: dict, variant, runner: TrialRunner, protocol: str) -> TrialOutcome:
    """Flatten a child's result into user attributes, objective values and the constraint."""
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
    if result.get("checked_ahead"):  # the verdict a warm-up child reached on the same file
        attrs["checked_ahead"] = True
    if "check" in result:
        attrs.update({k: result.get(k) for k in ("max_abs_err", "tol_share", "noise_share")})
        attrs["gate"] = result.get("gate", "course")
        attrs["check"] = {
            case: {
                k: c.get(k)
                for k in ("passed", "max_abs_err", "tol_share", "steps", "failure", "seconds")
            }
            for case, c in result["check"].items()
        }
    attrs["constraint"] = [constraint(result, runner.tol_share_limit)]
    values = None
    prefix = "full_" if protocol == "full" else ""
    if result.get("grader_peak_mib") is not None:
        attrs[f"{prefix}grader_peak_mib"] = result["grader_peak_mib"]
    if result["status"] == "ok" and result.get("traces"):
        attrs.update(trace_attrs(result["traces"], prefix))
        values = (attrs[f"{prefix}tokens_per_s"], attrs[f"{prefix}peak_mib"])
    elif result["status"] == "pruned":  # the traces it ran, no objective
        for name, t in result.get("traces", {}).items():
            attrs[f"tps_{name}"] = t["tokens_per_s"]
            attrs[f"seconds_{name}"] = t["seconds"]
    elif result["status"] == "infeasible":
        # the worst on both objectives: on no Pareto front (the dashboard's ignores constraints)
        values = (0.0, float("inf"))
    return TrialOutcome(result["status"], finite(attrs), values, result.get("reason"))


def constraint(result: dict, limit: float) -> float:
    """The gate's share minus its limit (<= 0: correct with margin): the tolerance share against
    `limit` (course gate), the noise share against 1 (noise gate, whose multiple holds the
    margin); a wrong answer of another kind (shape, dtype, aliasing) is infeasible whatever."""
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


# --- the child: `python -m search.trial JOB.json` -----------------------------------------------
# Its functions import what they run (the evaluator, the library, the kernel searches and with
# them Triton, which a CPU trial never loads): a child's imports are timed as its start-up phase.


def load_renderer(spec: str):
    """`module:function` or `/path/to/file.py:function`."""
    target, _, func = spec.rpartition(":")
    if not target.endswith(".py"):
        return getattr(importlib.import_module(target), func)
    module_spec = importlib.util.spec_from_file_location(f"_renderer_{Path(target).stem}", target)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot import renderer file {target}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return getattr(module, func)


class Phases:
    """The phase a trial is in (a marker file the parent reads when it kills a hung trial) and
    the seconds each took, for results.log's account of where a trial's time goes."""

    def __init__(self, output: Path):
        self.marker = Path(str(output) + ".phase")
        self.seconds: dict[str, float] = {}
        self.current, self.since = None, time.perf_counter()

    def enter(self, name: str | None) -> None:
        now = time.perf_counter()
        if self.current is not None:
            self.seconds[self.current] = round(now - self.since, 3)
        self.current, self.since = name, now
        if name is not None:
            log.info("phase %s", name)
            self.marker.write_text(name)


def prepare_gate(job: dict) -> tuple:
    """(the gate the job names, or None for the course's check; the check prepared with it: its
    references read from the job's noise cache, or computed there)."""
    from evaluator.correctness import prepare_check
    from evaluator.gate_choice import gate_from_dict
    from evaluator.gates import CourseGate

    judge = gate_from_dict(job["gate"]) if job.get("gate") else None
    cases = tuple(job.get("gate_cases", ("public", "stress")))
    gate_ = judge or CourseGate(job["atol"], job["rtol"])
    prepared = prepare_check(
        gate_, job["config"], job["weight_dir"], job["device"], cases,
        cache_dir=job.get("noise_cache"),
    )  # fmt: skip
    return judge, prepared


def gate(create_engine, job: dict, phases: Phases | None = None) -> dict:
    """The correctness gate of the job (the course's check unless the job names another), and
    the margin the search asks beyond it: half the course's tolerance, or within the noise
    gate's multiple."""
    from evaluator.correctness import check_prepared

    judge, prepared = prepare_gate(job)
    if phases is not None:
        phases.enter("correctness")
    cases = check_prepared(create_engine, prepared)
    shares = [c.get("noise_share") for c in cases.values() if c.get("noise_share") is not None]
    result = {
        "check": cases,
        "gate": judge.name if judge else "course",
        "max_abs_err": max(c["max_abs_err"] for c in cases.values()),
        "tol_share": max(c["tol_share"] for c in cases.values()),
        "noise_share": max(shares) if shares else None,
    }
    failed = {name: c["failure"] for name, c in cases.items() if not c["passed"]}
    if failed:
        # evaluator.correctness words an engine's exception '... raised <Exception>: ...': a
        # crash, not a wrong answer
        crash = any("create_engine raised" in f or "engine raised" in f for f in failed.values())
        reason = "; ".join(f"{name}: {failure}" for name, failure in failed.items())
        return {**result, "status": "failed" if crash else "infeasible", "reason": reason}
    limit = job.get("tol_share_limit", TOL_SHARE_LIMIT)
    if result["gate"] == "course" and result["tol_share"] > limit:
        reason = f"uses {result['tol_share']:.2f} of the tolerance (limit {limit})"
        return {**result, "status": "infeasible", "reason": reason}
    return {**result, "status": "ok", "reason": None}


def measure(create_engine, job: dict) -> dict:
    """Each trace timed. The full protocol in the grader's pattern: a warm-up engine alive, then
    a fresh engine per repeat, three (its peak is the grader's). Screening on one engine per
    trace: a warm-up pass, then two timed passes on it; building an engine per repeat tripled
    the engines built, and the leaders are timed again in the grader's pattern."""
    from evaluator.benchmark import time_trace
    from evaluator.benchmark_traces import get_trace

    full = job["protocol"] == "full"
    groups = tuple(job.get("pause_groups") or ())
    quiet = (lambda: held(groups)) if groups else None
    per_trace = {}
    for name in job["traces"]:
        trace = get_trace(name, job["config"])
        args = (create_engine, job["config"], job["weight_dir"], job["device"], trace)
        timing = time_trace(
            *args, warmup=1, repeat=3 if full else 2, fresh_engine=full, quiet=quiet
        )  # fmt: skip
        timing["floor_eff"] = _floor_efficiency(trace, job, timing["seconds"])
        per_trace[name] = timing
        log.info("%s: %.1f tokens/s", name, timing["tokens_per_s"])
        bar = (job.get("prune_below") or {}).get(name)
        if bar and timing["tokens_per_s"] < bar:
            raise Pruned(
                f"pruned at {name}: {timing['tokens_per_s']:,.0f} tok/s, under {PRUNE_SHARE:g} "
                f"of the best trial's ({bar / PRUNE_SHARE:,.0f})",
                per_trace,
            )
    return per_trace


class Pruned(Exception):
    """A screened trial far behind the best on a trace: its timing stops there."""

    def __init__(self, reason: str, traces: dict):
        super().__init__(reason)
        self.traces = traces


def _floor_efficiency(trace, job: dict, seconds: float):
    if not job.get("ceilings"):
        return None
    try:
        from evaluator.floor import Ceilings, dtype_bytes_for, floor_efficiency, trace_floor_seconds

        config = job["config"]
        dtype_bytes = dtype_bytes_for(config, job["device"])
        floor = trace_floor_seconds(trace, config, Ceilings(**job["ceilings"]), dtype_bytes)
        return floor_efficiency(floor, seconds)
    except Exception as exc:  # the floor model is a diagnostic; it never fails a trial
        log.warning("floor efficiency unavailable: %s", exc)
        return None


def kernel_knobs(job: dict, variant) -> dict | None:
    """The decode attention's table for a trial's engine: the job's (the kernel search's), or
    with the neutral prior the neutral defaults at every graph bucket; None: the rules."""
    if variant.attention != "triton" or not str(job["device"]).startswith("cuda"):
        return None
    from tuning.decode_attention import prior_table, table_from_json

    if job.get("knobs"):
        return table_from_json(job["knobs"])
    if job.get("kernel_prior") == "neutral":
        return prior_table(job["config"], variant, "neutral", job["device"])
    return None


def searched_table(job: dict, name: str, module: str, runs: bool, neutral) -> dict | None:
    """A kernel search's table for a trial's engine: the job's `name` (as JSON, read by the
    search's `module`) where the variant `runs` the kernels it tunes, or with the neutral prior
    `neutral()` (the search's neutral launches at every bucket); None: the rules."""
    if not runs or not str(job["device"]).startswith("cuda"):
        return None
    if job.get(name):
        return importlib.import_module(module).table_from_json(job[name])
    return neutral() if job.get("kernel_prior") == "neutral" else None


def few_row_knobs(job: dict, variant) -> dict | None:
    """The few-row kernels' table where the variant runs the fused layers (`searched_table`)."""
    from tuning.few_row import prior_table
    from variants.spec import ModelSpec

    fused = variant.layers in ("fused", "fused-pdl")
    neutral = lambda: prior_table(  # noqa: E731
        ModelSpec.from_config(job["config"]), variant, "neutral", job["device"]
    )
    return searched_table(job, "few_row_knobs", "tuning.few_row", fused, neutral)


def prefill_knobs(job: dict, variant) -> dict | None:
    """The prefill attention's table where the variant runs ours (`searched_table`)."""
    from tuning.prefill_attention import prior_table
    from variants.spec import ModelSpec

    ours = variant.attention == "triton"
    neutral = lambda: prior_table(ModelSpec.from_config(job["config"]), "neutral")  # noqa: E731
    return searched_table(job, "prefill_knobs", "tuning.prefill_attention", ours, neutral)


def neutral_tables(device, config: dict, variant) -> dict:
    """The kernel tables an engine of `variant` carries with the neutral prior and no search's
    table: every kernel it runs at its neutral launch (render's keyword arguments)."""
    job = {"device": str(device), "config": config, "kernel_prior": "neutral"}
    tables = {
        "knobs": kernel_knobs(job, variant),
        "few_row_knobs": few_row_knobs(job, variant),
        "prefill_knobs": prefill_knobs(job, variant),
    }
    return {k: v for k, v in tables.items() if v}


def run_job(job: dict, phases: Phases) -> dict:
    from evaluator.engine_loader import load_engine_module
    from search.shared_reads import SharedReads
    from variants.variant import Variant

    variant = Variant.from_dict(job["variant"])
    phases.enter("render")
    render = load_renderer(job.get("renderer") or DEFAULT_RENDERER)
    engine_path = Path(job["engine_path"])
    tables = {
        "knobs": kernel_knobs(job, variant),
        "few_row_knobs": few_row_knobs(job, variant),
        "prefill_knobs": prefill_knobs(job, variant),
    }
    extra = {k: v for k, v in tables.items() if v}  # (a renderer of the user's may not take them)
    render(variant, engine_path, job.get("header", ""), job.get("engine_budget_gib"), **extra)
    phases.enter("import")
    reads = SharedReads()  # the trial's engines read the weight file once (on a GPU)
    create_engine = reads.wrap(load_engine_module(engine_path).create_engine)
    # What is loaded now lives as long as the process: out of the cyclic collector's sight, so
    # that the benchmark's collections around each trace do not walk torch's objects each time.
    gc.freeze()
    result: dict = {"status": "ok", "reason": None}
    if job.get("check", True):
        digest = engine_digest(engine_path)
        earlier = job.get("checked") or {}
        if earlier.get("engine_sha256") == digest:
            # this file's verdict, reached by a warm-up child that ran the gate on it
            result = {key: earlier.get(key) for key in VERDICT}
            result["checked_ahead"] = True
        else:
            phases.enter("reference")  # the cases' calls and the gate's reference outputs
            result = gate(create_engine, job, phases)
        result["engine_sha256"] = digest
        if result["status"] != "ok":
            return result
    phases.enter("benchmark")
    try:
        result["traces"] = measure(create_engine, job)
    except Pruned as pruned:
        return {**result, "status": "pruned", "reason": str(pruned), "traces": pruned.traces}
    if result["traces"]:  # (a kernel warm-up times nothing)
        peak = max(t["peak_mib"] for t in result["traces"].values())
        if job["protocol"] == "full":  # every trace ran in the grader's pattern
            result["grader_peak_mib"] = peak
            where = "in the grader's pattern (a warm-up engine and two repeats alive)"
        else:  # one engine alive: less than the grader's pattern holds, never more
            where = "with one engine alive (the grader's pattern holds three)"
        budget = job.get("memory_budget_mib")
        if budget is not None and peak > budget:
            reason = f"peak {peak:.0f} MiB {where} is over the memory budget of {budget:.0f} MiB"
            result.update(status="infeasible", reason=reason)
    log.info("the weight file read %d time(s), %d served from a read", reads.reads, reads.hits)
    return result


def pause_groups(groups, sig: int = signal.SIGSTOP) -> None:
    """Stop (`sig`: continue) the process groups `groups`: the next trials' warm-up children,
    search/warmup.py's `WarmAhead`."""
    for group in groups:
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):  # (it ended meanwhile)
            continue


@contextmanager
def held(groups):
    """The process groups `groups` stopped while a trace's repeats are timed: a child compiling
    and running kernels on the GPU beside the timed engine would be timed with it. Outside the
    repeats (engine builds, warm-up passes) they run, the next trials' gates and compiles beside
    this trial's untimed work. The kernels a child queued before it stopped still run on the
    GPU: `HELD_SETTLE_S` for them. (The study continues them too once a trial ends, where this
    one was killed inside.)"""
    pause_groups(groups)
    time.sleep(HELD_SETTLE_S)
    try:
        yield
    finally:
        pause_groups(groups, signal.SIGCONT)


def stop_with_parent(poll_s: float = 1.0) -> None:
    """When the process that started this trial dies (a killed worker), stop too, with the
    engine's own processes: nobody would read the result, and on a GPU an orphaned trial would
    run beside the next one measured there."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        if os.getpgid(0) == os.getpid():  # the group `run_child` started: take it all down
            os.killpg(0, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="stop-with-parent", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m search.trial JOB.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    start = time.perf_counter()
    phases = Phases(Path(job["output"]))
    phases.enter("start-up")  # (run_job's imports: torch, the evaluator)
    try:
        result = run_job(job, phases)
    except Exception as exc:
        traceback.print_exc()
        result = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
    phases.enter(None)
    result["worker_seconds"] = time.perf_counter() - start
    result["phase_seconds"] = phases.seconds
    write_atomic(Path(job["output"]), json.dumps(result, default=str, allow_nan=True))
    return 0


if __name__ == "__main__":
    stop_with_parent()
    code = main()
    # The result is on disk: skip interpreter teardown (seconds with torch and an engine loaded).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
