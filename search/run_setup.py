"""Set-up of the main job: `--device` resolved, the device's ceilings measured, the budget and
trial limit by device kind, then the target, capabilities, space and trial runner of the job.
The worker, `sweep` and `render` resolve their device here too.
"""

from __future__ import annotations

import logging

from evaluator.gate_choice import select_gate
from search.environment import describe_environment
from search.errors import UserError
from search.space import SearchSpace
from search.target import resolve_target
from search.trial import TrialRunner
from search.trial_worker import CPU_OBJECTIVE_TRACES, OBJECTIVE_TRACES
from variants.probe import probe_capabilities

log = logging.getLogger("search.pipeline")  # the main job's log lines carry one name

DEFAULT_BUDGET_MIN = {"cuda": 20.0, "cpu": 5.0}
# The course's grader runs on an RTX 3090: its target's memory budget by default.
COURSE_GRADER_GIB = 24.0
# Engines alive at once in the grader's pattern: the warm-up engine, the last repeat's and the
# one being built. Each written engine gets this share of the memory budget (MEMORY_BUDGET_GIB).
ENGINES_ALIVE = 3
DEFAULT_TRIAL_TIMEOUT_S = {"cuda": 300.0, "cpu": 180.0}
CPU_STRESS_MAX_POSITIONS = 1024  # above this, CPU trials skip the stress case (see gate_cases)


def resolve_device(text: str) -> str:
    import torch

    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(text)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cuda", "cpu"):
        raise UserError(f"--device must be auto, cpu, cuda or cuda:N, got {text!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {text}, but torch sees no CUDA device; use --device cpu")
    if device.type == "cuda" and device.index is not None:
        if device.index >= torch.cuda.device_count():
            count = torch.cuda.device_count()
            raise UserError(f"--device {text}, but torch sees {count} CUDA device(s)")
    return text


def measure_ceilings(device: str) -> dict | None:
    try:
        from evaluator.floor import measure_ceilings as measure

        return measure(device).to_dict()
    except Exception as exc:  # floor efficiency is a diagnostic
        log.warning("could not measure the device ceilings: %s", exc)
        return None


def set_up(job) -> None:
    """The job's device, target, capabilities, space, budget and deadline, trial limit,
    environment and trial runner (from `job.args`, counted from `job.start`)."""
    args = job.args
    job.device = resolve_device(args.device)
    kind = "cuda" if job.device.startswith("cuda") else "cpu"
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
    job.notes.append(f"budget {minutes:g} min, trial limit {job.trial_timeout:.0f} s")
    job.environment = describe_environment(job.device)
    job.memory_budget_gib, why = memory_budget_gib(args, job.device)
    job.notes.append(
        f"memory budget {job.memory_budget_gib:g} GiB ({why}): an assembly whose peak in the "
        "grader's pattern (a warm-up engine and two repeats alive) exceeds it is rejected; the "
        f"written engine's MEMORY_BUDGET_GIB is a third of it"
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
    )
    # Verification runs public and stress in a fresh process: on a CPU with a long context the
    # stress case alone took over 10 minutes (public config, 2 cores).
    job.stress_positions = stress_positions(job, kind)
    long_cpu = job.runner.gate_cases == ("public",)
    job.verify_timeout = max(600.0, 4 * job.trial_timeout, 2400.0 if long_cpu else 0.0)
    log.info(
        "target %s on %s; %d assemblies in the space",
        job.target.config_path,
        job.device,
        job.space.size,
    )


def choose_gate(asked: str, target):
    """(gate, one-line reason): --gate course or noise as asked; auto: the course's exact check
    for the course's float16 target, the noise gate for every other model."""
    from evaluator.gates import CourseGate, NoiseGate

    if asked == "course":
        return CourseGate(measure_noise=True), "course gate: asked for with --gate course"
    if asked == "noise":
        return NoiseGate(), "noise gate: asked for with --gate noise"
    return select_gate(target.config_path, target.config)


def check_dtype(target, device: str) -> None:
    """The config's dtype must run here: bfloat16 needs a GPU that computes it."""
    import torch

    from variants.spec import ModelSpec

    spec = ModelSpec.from_config(target.config)
    if device.startswith("cuda") and spec.config_dtype == torch.bfloat16:
        if not torch.cuda.is_bf16_supported():
            raise UserError(
                f"{target.config_path.name} says bfloat16, which this GPU does not compute; "
                "use --device cpu (float32) or a GPU of compute capability 8.0 or newer"
            )


def device_memory_gib(device: str) -> float:
    """The GPU's memory, or the host's (MemTotal) for a CPU."""
    import torch

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
    if args.memory_budget_gib is not None:
        if args.memory_budget_gib <= 0:
            raise UserError(f"--memory-budget-gib must be > 0, got {args.memory_budget_gib}")
        return args.memory_budget_gib, "--memory-budget-gib"
    if args.model_config is None:
        return COURSE_GRADER_GIB, "the course's target: its grader is a 24 GB RTX 3090"
    return round(device_memory_gib(device), 1), "this device's memory"


def stress_positions(job, kind: str) -> int | None:
    """On a CPU with a long context the verification's stress case puts its longest request at
    CPU_STRESS_MAX_POSITIONS: at the config's own limit the reference alone takes many minutes
    there. None: the config's limit."""
    most = job.target.config["max_position_embeddings"]
    if kind == "cpu" and most > CPU_STRESS_MAX_POSITIONS:
        job.notes.append(
            f"CPU: the verification's stress case reaches {CPU_STRESS_MAX_POSITIONS} positions "
            f"(the config allows {most}: its reference alone would take many minutes here)"
        )
        return CPU_STRESS_MAX_POSITIONS
    return None


def gate_cases(job, kind: str) -> tuple[str, ...]:
    """Trials on a CPU with a long context are gated on the public case alone: the stress case's
    near-limit prompt costs the float32 reference many minutes there (public config: over 5
    minutes on 2 cores, against 38 s for the public case). The written engine still passes both
    cases in verification."""
    if kind == "cpu" and job.target.config["max_position_embeddings"] > CPU_STRESS_MAX_POSITIONS:
        job.notes.append(
            "CPU: trials are gated on the public correctness case (stress costs minutes per "
            "trial at this context length); the written engine passes public and stress"
        )
        return ("public",)
    return ("public", "stress")


def objective_traces(job, kind: str) -> tuple[str, ...]:
    if job.args.traces:
        return tuple(t.strip() for t in job.args.traces.split(",") if t.strip())
    if kind == "cpu":
        job.notes.append(
            "CPU: the objective times " + ", ".join(CPU_OBJECTIVE_TRACES) + " (the continuous"
            " trace takes too long per trial on a CPU; add it with --traces)"
        )
        return CPU_OBJECTIVE_TRACES
    return OBJECTIVE_TRACES
