"""Set-up, before any trial: the target pre-flighted, the device, gate, budgets, capabilities,
search space and trial runner resolved, this machine described; `resolve_device` for every
command."""

from __future__ import annotations

import atexit
import importlib.metadata
import logging
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from evaluator.benchmark_traces import get_trace
from evaluator.engine_loader import out_of_range
from evaluator.floor import measure_ceilings as measure_device_ceilings
from evaluator.gate_choice import select_gate
from evaluator.gates import CourseGate, NoiseGate
from search.trial import (
    CPU_OBJECTIVE_TRACES,
    OBJECTIVE_TRACES,
    PRUNE_SHARE,
    TrialRunner,
    load_renderer,
)
from variants.checkpoint.preflight import resolve_target
from variants.probe import UserError, probe_capabilities, resolve_device
from variants.registry import AXES
from variants.spec import ModelSpec
from variants.variant import Variant

log = logging.getLogger(__name__)


DEFAULT_BUDGET_MIN = {"cuda": 20.0, "cpu": 5.0}
DEFAULT_TRIAL_TIMEOUT_S = {"cuda": 300.0, "cpu": 180.0}
COURSE_GRADER_GIB = 24.0  # the course's grader runs on an RTX 3090: its target's memory budget
# Engines alive at once in the grader's pattern: the warm-up engine, the last repeat's and the
# one being built. Each written engine gets this share of the memory budget (MEMORY_BUDGET_GIB).
ENGINES_ALIVE = 3
CPU_STRESS_MAX_POSITIONS = 1024  # above this, CPU trials skip the stress case (see gate_cases)
# a study's name where it names its SQLite file in the studies folder (no --storage)
STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# flag: (the least value, whether the least itself is allowed)
LEAST = {
    "--budget-minutes": (0, False), "--trial-timeout": (0, False),
    "--memory-budget-gib": (0, False), "--trials": (1, True), "--remeasure": (0, True),
    "--heartbeat": (0, True), "--warm-workers": (0, True), "--top": (1, True),
    "--time-limit": (0, False),
}  # fmt: skip
ENGINE_START = b'"""Standalone inference engine'  # a rendered engine's first bytes
# command: its flags that name a file (or a folder) it writes
OUTPUTS = {
    "render": ("--output", "file"),
    "report": ("--out", "folder"),
    "sweep": ("--out", "file"),
}


def check_arguments(args) -> None:
    """A command's numbers, names and paths as given, before anything is read or written: one
    line naming the flag and what it takes (the flags a command does not have are skipped)."""
    given = lambda flag: getattr(args, flag[2:].replace("-", "_"), None)  # noqa: E731
    for flag, (least, allowed) in LEAST.items():
        if (value := given(flag)) is not None and out_of_range(value, least, allowed):
            raise UserError(
                f"{flag} must be a number {'>=' if allowed else '>'} {least}, got {value}"
            )
    for flag in ("--model-config", "--weight-dir"):
        if (value := given(flag)) is not None and not value.strip():
            raise UserError(
                f"{flag} is empty (an unset shell variable?): give a path or leave it out"
            )
    name = given("--study")
    if name is not None and given("--storage") is None and not STUDY_NAME.fullmatch(name):
        raise UserError(
            f"--study {name!r}: a study stored in the studies folder is named by letters, digits, "
            "'.', '_' and '-' (up to 128; its file is studies/NAME.db)"
        )
    flag, kind = OUTPUTS.get(getattr(args, "command", None), (None, None))
    if flag and given(flag) is not None:
        check_output(flag, Path(given(flag)), kind, engine=args.command == "render")
    if (sweep := given("--sweep")) is not None and not os.path.isfile(sweep):
        raise UserError(
            f"--sweep {sweep}: no such file; give the JSON `python -m search sweep` wrote"
        )
    if (renderer := given("--renderer")) is not None:
        try:
            load_renderer(renderer)
        except Exception as exc:  # a module, file or function that is not there
            raise UserError(
                f"--renderer {renderer}: {type(exc).__name__}: {exc}; give module:function or "
                "FILE.py:function"
            ) from None


def device_kind(device: str) -> str:
    """ "cuda" or "cpu": what the defaults (budget, trial limit, traces, sweep) depend on."""
    return "cuda" if device.startswith("cuda") else "cpu"


def measure_ceilings(device: str) -> dict | None:
    try:
        return measure_device_ceilings(device).to_dict()
    except Exception as exc:  # floor efficiency is a diagnostic
        log.warning("could not measure the device ceilings: %s", exc)
        return None


def set_up(job) -> None:
    """The job's device, target, gate, capabilities, space, budget and deadline, trial limit,
    environment, memory budget and trial runner (from `job.args`, counted from `job.start`)."""
    args = job.args
    job.device = resolve_device(args.device)
    kind = device_kind(job.device)
    job.target = resolve_target(args.model_config, args.weight_dir)
    check_dtype(job.target, job.device)
    gate, why = choose_gate(args.gate, job.target)
    job.gate = gate.name
    job.notes.append(why)
    job.caps = probe_capabilities(job.device, job.target.config)
    job.space = SearchSpace(job.caps)
    minutes = args.budget_minutes if args.budget_minutes else DEFAULT_BUDGET_MIN[kind]
    job.budget_s = 60 * minutes
    job.deadline = job.start + job.budget_s
    job.trial_timeout = args.trial_timeout or DEFAULT_TRIAL_TIMEOUT_S[kind]
    # kept after the search: the shape sweep, and on a GPU the leader's kernel search
    kernels = kind == "cuda" and getattr(args, "kernel_search", False)
    prior = "neutral" if getattr(args, "neutral_kernels", False) else "hand"
    job.kernel_search_s = search_share_s(job.budget_s, prior) if kernels else 0.0
    if job.kernel_search_s < LEAST_S:  # a budget too short for it keeps nothing for it
        job.kernel_search_s, kernels = 0.0, False
    job.budget = Budget(
        job.deadline,
        job.trial_timeout,
        total_s=job.budget_s,
        leader_trials=getattr(args, "remeasure", 0) * REMEASURE_TRIALS[kind],
        verify_trials=VERIFY_TRIALS[kind],
        verify_least_s=VERIFY_LEAST_S[kind],
        after_s=WRAP_UP_S,
        sweep_s=sweep_reserve_s(kind, job.budget_s),
        sweep_trials=SWEEP_TRIALS[kind],
        confirm_trials=REMEASURE_TRIALS[kind] if getattr(args, "remeasure", 0) else 0.0,
        kept_s=job.kernel_search_s,
        kept_trials=LEADER_TIMINGS if kernels else 0.0,
        kept_after=KERNEL_SEARCH_AFTER,
        kept_contenders=KERNEL_CONTENDERS,
    )
    job.notes.append(
        f"budget {minutes:g} min from run.sh's start, trial limit {job.trial_timeout:.0f} s; the "
        f"trials stop where the verification ({VERIFY_TRIALS[kind]:g} typical trials until the "
        f"study has timed one), the sweep, the leader's full-protocol run and, within "
        f"{job.budget.max_reserve_share:.0%} of the budget, the other leaders' still fit"
        + (
            f" (and, once {KERNEL_SEARCH_AFTER} trials are timed, the kernel search's "
            f"{job.kernel_search_s:.0f} s and its leader's timings, twice where both fit in "
            f"{KERNEL_RESERVE_SHARE:.0%} of the budget: a close rival's, or the leader's longer)"
            if kernels
            else ""
        )
        + f"; a screened trial stops at the first trace it runs under {PRUNE_SHARE:g} of the "
        "best trial's speed (pruned)"
    )
    job.environment = describe_environment(job.device)
    job.memory_budget_gib, why = memory_budget_gib(args, job.device)
    check_weights_fit(job.target, job.device, job.memory_budget_gib, why)
    job.notes.append(
        f"memory budget {job.memory_budget_gib:g} GiB ({why}): an assembly whose peak in the "
        "grader's pattern (a warm-up engine and two repeats alive, the full protocol's) exceeds "
        "it is rejected, and one whose single screening engine does; the written engine's "
        "MEMORY_BUDGET_GIB is a third of it"
    )
    job.runner = TrialRunner(
        job.target.config,
        str(job.target.weight_dir),
        job.device,
        renderer=args.renderer,
        traces=objective_traces(job, kind),
        timeout_s=job.trial_timeout,
        gate_cases=gate_cases(job, kind),
        gate=gate.to_dict(),
        memory_budget_mib=1024 * job.memory_budget_gib,
        engine_budget_gib=job.memory_budget_gib / ENGINES_ALIVE,
        kernel_prior=prior,
        noise_cache=scratch_dir("search-noise-"),
    )
    # (verification runs public and stress: on a CPU with a long context, for many minutes)
    long_cpu = job.runner.gate_cases == ("public",)
    job.stress_positions = CPU_STRESS_MAX_POSITIONS if long_cpu else None
    job.verify_timeout = max(600.0, 4 * job.trial_timeout, 2400.0 if long_cpu else 0.0)
    target, size = job.target.config_path, job.space.size
    log.info("target %s on %s; %d assemblies in the space", target, job.device, size)


def scratch_dir(prefix: str) -> str:
    """A temporary folder removed when the job's process exits."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


# What the steps after the search take, in typical trials (a median trial's seconds), as
# measured in studies on each kind of device. A leader's full-protocol run builds three times
# the engines a screened trial does (a fresh engine a repeat, where screening builds one a
# trace): more than a trial, more still where engine builds weigh more (a CPU, a model of a
# billion parameters). The verification, until a study has measured its own: every correctness
# case from a cold reference, the stress case at a long context, then a benchmark, each a fresh
# process that reads the weights itself (a trial's engines share one read): several trials.
REMEASURE_TRIALS = {"cpu": 1.5, "cuda": 1.5}
VERIFY_TRIALS = {"cpu": 3.0, "cuda": 3.0}
# ... and at the least, where trials take a second: its two fresh processes' start-up.
VERIFY_LEAST_S = {"cpu": 10.0, "cuda": 0.0}
# The trials timed before the kernel search's time is kept in the reserve: it searches a
# leader's kernels, and on a short budget the trials that find the leader come first.
KERNEL_SEARCH_AFTER = 3
# Choices whose trials cost several others and do not win here, offered only while a budget has
# time for them (`Budget.affords_costly`): torch.compile (a trial several times an eager one, its
# build included; on a GPU max-autotune's builds longest, and there the fused Triton layers and
# graphs lead), on a GPU float32 compute on a 16-bit model (twice the bytes a step) and the flex
# attention (Inductor traces and builds it in each trial's process however warm its caches; the
# Triton attention leads there).
COSTLY = {
    "cpu": {"execution": ("compile",)},
    "cuda": {"execution": ("compile",), "dtype": ("float32",), "attention": ("flex",)},
}
# Their trials' share of the search's seconds at most, and the least seconds, in typical trials,
# a costly trial is expected to take: the costly choices differ by several times (torch.compile's
# default build against max-autotune's, compile against flex), so one timed says little of the
# next.
COSTLY_SHARE = 0.25
COSTLY_PRIOR_TRIALS = 10.0
# the shape sweep's process start, the figures and results.log
WRAP_UP_S = 5.0
# The kernel search (search/kernel_phase.py): the share of the run's budget it may take, and its
# most seconds, for each of the engines it may search: the leader and a close rival
# (`kernel_contest`; without one the leader takes both shares)
KERNEL_SHARE, KERNEL_MOST_S = 0.1, 300.0
KERNEL_CONTENDERS = 2
# ... where the contenders' shares and timings all fit in this share of the budget (else one)
KERNEL_RESERVE_SHARE = 0.35
# the share from the neutral prior (--neutral-kernels), which has every launch to find (a
# search of 10 % reached about half the few-row kernels' row buckets: docs/PERF.md)
NEUTRAL_KERNEL_SHARE = 0.25
# the least that is worth a search (engine build and compiles aside)
LEAST_S = 20.0
# the leader timed with the rules and with the table, in typical trials (a full-protocol
# timing is one and a half to two): kept for it in the study's reserve
LEADER_TIMINGS = 4.0
# The shape sweep at the end of run.sh (search/sweep_command.py) adds shapes for at most
# PIPELINE_LIMIT_S (less when the budget is nearly spent, on a GPU never under MIN_GPU_LIMIT_S:
# the figures need a few shapes). The trials leave it a tenth of a GPU's budget within those
# bounds: a short budget's time goes to trials, not figures.
PIPELINE_LIMIT_S = {"cpu": 10.0, "cuda": 90.0}
MIN_GPU_LIMIT_S = 20.0
SWEEP_SHARE = 0.1
# The sweep's engines' builds on a GPU, on top of its shapes' limit (as measured)
BUILDS_GPU_S = 28.0
LEAST_GPU_S = MIN_GPU_LIMIT_S + BUILDS_GPU_S
# ... but a GPU's sweep ends when its shapes are measured, in about a trial and a half (it builds
# three engines and times fewer shapes than a trial's traces): once trials are timed, the trials
# keep it at most two typical trials of its reserve. A CPU's keeps its limit (its figures are few
# shapes; its builds weigh more).
SWEEP_TRIALS = {"cpu": 0.0, "cuda": 2.0}


def search_share_s(total_s: float, prior: str) -> float:
    """The kernel search's seconds in a run of `total_s`: its share from `prior`, at most
    KERNEL_MOST_S."""
    return min((KERNEL_SHARE if prior == "hand" else NEUTRAL_KERNEL_SHARE) * total_s, KERNEL_MOST_S)


def sweep_reserve_s(kind: str, total_s: float) -> float:
    """What the trials leave the sweep in a budget of `total_s`: on a GPU its share, at least
    what it takes at the least and at most its limit; on a CPU its limit."""
    if kind == "cpu":
        return PIPELINE_LIMIT_S["cpu"]
    return max(LEAST_GPU_S, min(PIPELINE_LIMIT_S["cuda"], SWEEP_SHARE * total_s))


@dataclass
class Budget:
    """The loop's deadline and the reserve after it: the leaders' full-protocol runs
    (`leader_trials` typical trials), the verification (`verify_s` as the study measured it,
    else `verify_trials` typical trials and at least `verify_least_s`; 0: none), the shape
    sweep (`sweep_estimate_s`) and `after_s` (the wrap-up), at most `max_reserve_share` of the
    budget but never less than the verification, the sweep and, once a trial is timed, the
    winner's full-protocol run (`confirm_trials` typical trials: its figures are the grader's
    protocol's, not one screening measurement); then
    `kept_s` plus `kept_trials` typical trials (the kernel search and its leader's timings)
    once `kept_after` trials are timed, for each of `kept_contenders` engines where they all fit
    in KERNEL_RESERVE_SHARE of the budget, else one (`kept_reserve_s`): a search needs a
    leader, and on a short budget the first trials come before it (it then runs in what is left,
    or says there was no time)."""

    deadline: float  # time.monotonic() value
    trial_timeout_s: float
    total_s: float = 0.0
    leader_trials: float = 0.0
    verify_trials: float = 0.0
    verify_s: float | None = None
    verify_least_s: float = 0.0
    max_reserve_share: float = 0.35
    first_guess_s: float = 20.0
    after_s: float = 0.0
    sweep_s: float = 0.0
    sweep_trials: float = 0.0
    confirm_trials: float = 0.0
    kept_s: float = 0.0
    kept_trials: float = 0.0
    kept_after: int = 0
    kept_contenders: int = 1

    def contenders(self, durations: list[float]) -> int:
        """The engines whose kernel search the reserve keeps (`kept_contenders` or one)."""
        one = self.kept_s + self.kept_trials * self.typical_trial_s(durations)
        fits = self.kept_contenders * one <= KERNEL_RESERVE_SHARE * self.total_s
        return self.kept_contenders if fits else 1

    def kept_reserve_s(self, durations: list[float]) -> float:
        """The kernel search's reserve: its share and its leader's timings, each contender's."""
        one = self.kept_s + self.kept_trials * self.typical_trial_s(durations)
        return self.contenders(durations) * one

    def typical_trial_s(self, durations: list[float]) -> float:
        return statistics.median(durations) if durations else self.first_guess_s

    def verify_estimate_s(self, durations: list[float]) -> float:
        """Seconds the verification is expected to take (0 without one)."""
        if not self.verify_trials:
            return 0.0
        guess = max(self.verify_trials * self.typical_trial_s(durations), self.verify_least_s)
        return self.verify_s or guess

    def sweep_estimate_s(self, durations: list[float]) -> float:
        """Seconds kept for the shape sweep: `sweep_s`, or less once trials are timed where
        `sweep_trials` typical trials are less."""
        if self.sweep_trials and durations:
            return min(self.sweep_s, self.sweep_trials * self.typical_trial_s(durations))
        return self.sweep_s

    def seconds_for_trials(self, durations: list[float]) -> float:
        """Seconds left for trials: to the deadline, less the reserve."""
        typical = self.typical_trial_s(durations)
        # the leader's run once there is one (a first guess of it would keep the first trial out)
        confirm = self.confirm_trials * typical if durations else 0.0
        needed = self.verify_estimate_s(durations) + self.sweep_estimate_s(durations)
        needed += self.after_s + confirm
        wanted = needed + max(0.0, self.leader_trials - self.confirm_trials) * typical
        reserve = max(min(wanted, self.max_reserve_share * self.total_s), needed)
        if len(durations) >= self.kept_after:
            reserve += self.kept_reserve_s(durations)
        return self.deadline - time.monotonic() - reserve

    def time_for_trial(self, durations: list[float]) -> float | None:
        """Seconds the next trial may take, or None when the budget is spent."""
        left = self.seconds_for_trials(durations)
        if left < 0.75 * self.typical_trial_s(durations):
            return None
        return min(self.trial_timeout_s, left)

    def affords_costly(
        self,
        durations: list[float],
        costly_s: list[float],
        spent_s: float,
        searched_s: float,
        share: float = COSTLY_SHARE,
    ) -> bool:
        """Whether a costly assembly (COSTLY) may start now: its seconds (the median of the
        costly trials timed, `costly_s`, at least COSTLY_PRIOR_TRIALS typical trials) fit in
        what is left for trials, and with the `spent_s` costly trials took so far stay within
        `share` of the search's seconds (the `searched_s` run and those left)."""
        left = self.seconds_for_trials(durations)
        expected = COSTLY_PRIOR_TRIALS * self.typical_trial_s(durations)
        if costly_s:
            expected = max(expected, statistics.median(costly_s))
        return expected <= left and spent_s + expected <= share * (searched_s + left)


def choose_gate(asked: str, target):
    """(gate, one-line reason): --gate course or noise as asked; auto: the course's exact check
    for the course's float16 target, the noise gate for every other model."""
    if asked == "course":
        return CourseGate(measure_noise=True), "course gate: asked for with --gate course"
    if asked == "noise":
        return NoiseGate(), "noise gate: asked for with --gate noise"
    return select_gate(target.config_path, target.config)


def check_dtype(target, device: str) -> None:
    """The config's dtype must run here: bfloat16 needs a GPU that computes it."""
    spec = ModelSpec.from_config(target.config)
    if device.startswith("cuda") and spec.config_dtype == torch.bfloat16:
        if not torch.cuda.is_bf16_supported():
            raise UserError(
                f"{target.config_path.name} says bfloat16, which this GPU does not compute; "
                "use --device cpu (float32) or a GPU of compute capability 8.0 or newer"
            )


def device_memory_gib(device: str) -> float:
    """The GPU's memory, or the host's (MemTotal) for a CPU."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(torch.device(device)).total_memory / 2**30
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    return 16.0  # (not Linux: a laptop's worth)


def memory_budget_gib(args, device: str) -> tuple[float, str]:
    """--memory-budget-gib; else the course's grader's GPU for the course's target (no
    --model-config); else this device's memory."""
    if args.memory_budget_gib is not None:  # (a number > 0: check_arguments)
        return args.memory_budget_gib, "--memory-budget-gib"
    if args.model_config is None:
        return COURSE_GRADER_GIB, "the course's target: its grader is a 24 GB RTX 3090"
    return round(device_memory_gib(device), 1), "this device's memory"


def check_output(flag: str, path: Path, kind: str, engine: bool = False) -> None:
    """A file (or folder) a command will write: not the other kind, in a folder it can create or
    write; an `engine` output replaces only an engine file (a user's other file is read, never
    written)."""
    wrong = path.is_dir() if kind == "file" else path.exists() and not path.is_dir()
    if wrong:
        raise UserError(
            f"{flag} {path} is a {'folder' if kind == 'file' else 'file'}: give a {kind} path"
        )
    existing = path.parent if kind == "file" else path
    while not existing.exists():
        existing = existing.parent
    try:  # (a probe, not os.access: root passes the mode bits where the kernel refuses)
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UserError(
            f"{flag} {path}: cannot write in {existing} ({exc.strerror}); give a path in a "
            "writable folder"
        ) from None
    if engine and path.is_file() and not path.read_bytes()[:64].startswith(ENGINE_START):
        raise UserError(
            f"{flag} {path} exists and is not an engine file: give a new path (it is left as it is)"
        )


def check_weights_fit(target, device: str, budget_gib: float, why: str) -> None:
    """Each of the grader's live engines (a third of the budget) must hold the model's weights
    in the dtype it computes in here, with room for a cache; else no trial could run."""
    spec = ModelSpec.from_config(target.config)
    dtype = spec.compute_dtype(device)
    weights_gib = target.numel * torch.empty((), dtype=dtype).element_size() / 2**30
    if weights_gib >= budget_gib / ENGINES_ALIVE:
        need = math.ceil(10 * ENGINES_ALIVE * 1.25 * weights_gib) / 10
        raise UserError(
            f"the memory budget of {budget_gib:g} GiB ({why}) leaves each of the grader's "
            f"{ENGINES_ALIVE} live engines {budget_gib / ENGINES_ALIVE:.3g} GiB, less than the "
            f"model's weights ({weights_gib:.3g} GiB in {str(dtype).removeprefix('torch.')} on "
            f"{device}): give --memory-budget-gib {need:g} or more"
        )


def gate_cases(job, kind: str) -> tuple[str, ...]:
    """Trials on a CPU with a long context are gated on the public case alone: the stress case's
    near-limit prompt costs the float32 reference many minutes there. The written engine still
    passes both cases in verification, the stress case's longest request at
    CPU_STRESS_MAX_POSITIONS."""
    most = job.target.config["max_position_embeddings"]
    if kind != "cpu" or most <= CPU_STRESS_MAX_POSITIONS:
        return ("public", "stress")
    job.notes.append(
        "CPU: trials are gated on the public correctness case (stress costs minutes per "
        "trial at this context length); the written engine passes public and stress"
    )
    job.notes.append(
        f"CPU: the verification's stress case reaches {CPU_STRESS_MAX_POSITIONS} positions "
        f"(the config allows {most}: its reference alone would take many minutes here)"
    )
    return ("public",)


def objective_traces(job, kind: str) -> tuple[str, ...]:
    if job.args.traces:
        names = tuple(t.strip() for t in job.args.traces.split(",") if t.strip())
        for name in names or [""]:
            try:
                get_trace(name, job.target.config)
            except KeyError as exc:  # "unknown trace 'x'; known: ..."
                raise UserError(f"--traces: {exc.args[0]}") from None
        return names
    if kind == "cpu":
        job.notes.append(
            "CPU: the objective times " + ", ".join(CPU_OBJECTIVE_TRACES) + " (the continuous"
            " trace takes too long per trial on a CPU; add it with --traces)"
        )
        return CPU_OBJECTIVE_TRACES
    return OBJECTIVE_TRACES


# --- this machine: GPU, driver, torch, CUDA, triton, Python (for the results log) --------------


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver() -> str | None:
    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def describe_environment(device: str) -> dict:
    env = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "device": device,
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "triton": _version("triton") or _version("pytorch-triton"),
        "optuna": _version("optuna"),
        "gpu": None,
    }
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(device).index or 0)
        env["gpu"] = props.name
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["compute_capability"] = f"{props.major}.{props.minor}"
        env["gpu_count"] = torch.cuda.device_count()
        env["driver"] = _driver()
        env["cudnn"] = torch.backends.cudnn.version()
    return env


# --- the search space -------------------------------------------------------------------------
# The variant registry walked define-by-run, filtered by the capability probe. An axis is
# suggested only when it applies to the choices made so far and this machine offers more than one
# value for it. Optuna forbids one parameter name with two different choice lists, so when
# earlier choices narrow an axis the parameter gets a qualified name (`sdpa_backend[auto|math]`).


class SearchSpace:
    def __init__(self, caps):
        self.caps = caps
        self.offered: dict[str, tuple] = {axis.name: () for axis in AXES}
        self.assemblies = [Variant.from_dict(partial) for partial in self._walk(0, {})]
        self.size = len(self.assemblies)
        self.offered = {name: values for name, values in self.offered.items() if values}

    def _walk(self, index: int, partial: dict):
        """Record every choice reachable here; yield the complete variants' choices."""
        if index == len(AXES):
            yield partial
            return
        axis = AXES[index]
        if not axis.applies(partial):
            yield from self._walk(index + 1, partial)
            return
        choices = self.caps.choices(axis.name, partial)
        seen = self.offered[axis.name]
        self.offered[axis.name] = seen + tuple(c for c in choices if c not in seen)
        for c in choices:
            yield from self._walk(index + 1, {**partial, axis.name: c})

    def param_name(self, axis_name: str, choices: list) -> str:
        full = [c for c in self.offered[axis_name] if c in choices]
        if full == list(self.offered[axis_name]):
            return axis_name
        return f"{axis_name}[{'|'.join(str(c) for c in full)}]"

    def _choose(self, pick, skip: dict | None = None) -> tuple[Variant, dict]:
        partial: dict = {}
        params: dict = {}
        for axis in AXES:
            if not axis.applies(partial):
                continue
            choices = self.caps.choices(axis.name, partial)
            if not choices:
                raise RuntimeError(f"no valid {axis.name} here after {partial}")
            kept = [c for c in choices if c not in (skip or {}).get(axis.name, ())]
            choices = kept or choices
            if len(choices) == 1:
                partial[axis.name] = choices[0]
                continue
            name = self.param_name(axis.name, choices)
            partial[axis.name] = params[name] = pick(axis.name, name, choices)
        return Variant.from_dict(partial), params

    def suggest(self, trial, skip: dict | None = None) -> Variant:
        """The variant of an Optuna trial, suggesting one parameter per open axis; `skip`: axis
        -> choices not offered this time (an axis keeps its last choice)."""
        pick = lambda axis, name, choices: trial.suggest_categorical(name, choices)  # noqa: E731
        return self._choose(pick, skip)[0]

    def is_costly(self, variant: Variant, kind: str) -> bool:
        """Whether `variant` takes one of COSTLY's choices for a `kind` device."""
        values = self.canonical(variant).to_dict()
        return any(values[axis] in choices for axis, choices in COSTLY[kind].items())

    def params_for(self, variant: Variant) -> dict:
        """The parameters `suggest` would record for `variant` (for `enqueue_trial`)."""
        reason = self.caps.why_invalid(variant)
        if reason is not None:
            raise ValueError(f"{variant.name} is not offered here: {reason}")
        values = variant.to_dict()
        return self._choose(lambda axis, name, choices: values[axis])[1]

    def canonical(self, variant: Variant) -> Variant:
        """`variant` with the fields of axes that do not apply reset to their defaults."""
        values = variant.to_dict()
        return self._choose(lambda axis, name, choices: values[axis])[0]

    def describe(self) -> list[tuple[str, tuple]]:
        """(axis, choices offered on this machine) in registry order."""
        return [(axis.name, self.offered[axis.name]) for axis in AXES if axis.name in self.offered]
