"""One trial, inside its own process: render the variant, import it, gate it, time it.

Run as `python -m search.trial_worker JOB.json`; the job names the variant, the model, the
renderer and the protocol. The result is written as JSON to the job's `output`; before each phase
the phase name is written to `output + ".phase"`, so a parent that kills a hung trial can say
where it hung. Exceptions are results too (status "failed"); only a dead process leaves no JSON.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import logging
import os
import signal
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

log = logging.getLogger("search.trial_worker")

# The objective's traces: the public benchmark and the serving trace closest to the grader's load.
OBJECTIVE_TRACES = ("prefill", "decode", "mixed", "continuous")
# On a CPU the continuous trace alone takes ~19 s per pass for the 2-layer test model (measured on
# a 2-core EPYC): a trial would take a minute, so CPU studies time the public three.
CPU_OBJECTIVE_TRACES = ("prefill", "decode", "mixed")
DEFAULT_RENDERER = "variants.render:render_engine"
# A trial may use at most this share of the tolerance: a variant that passes by a hair here can
# fail on the hidden model or traces.
TOL_SHARE_LIMIT = 0.5
# In the quick protocol a pass longer than this is timed once (see `time_one`).
QUICK_LONG_PASS_S = 1.0


def load_renderer(spec: str):
    """`module:function` or `/path/to/file.py:function`."""
    target, _, func = spec.rpartition(":")
    if target.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location(
            f"_renderer_{Path(target).stem}", target
        )
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot import renderer file {target}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    return getattr(module, func)


class Phases:
    def __init__(self, output: Path):
        self.marker = Path(str(output) + ".phase")

    def enter(self, name: str) -> None:
        log.info("phase %s", name)
        self.marker.write_text(name)


def _crashed(failure: str) -> bool:
    """The correctness gate reports engine exceptions as failures; those are crashes, not wrong
    answers (`evaluator.correctness` words them '... raised <Exception>: ...')."""
    return "create_engine raised" in failure or "engine raised" in failure


def gate(create_engine, job: dict) -> dict:
    """The correctness gate of the job (the course's check unless the job names another), and
    the margin the search asks beyond it: half the course's tolerance, or within the noise
    gate's multiple."""
    from evaluator.correctness import check_engine
    from evaluator.gate_choice import gate_from_dict

    judge = gate_from_dict(job["gate"]) if job.get("gate") else None
    tolerance = {} if judge else {"atol": job["atol"], "rtol": job["rtol"]}
    cases = check_engine(
        create_engine,
        job["config"],
        job["weight_dir"],
        job["device"],
        cases=tuple(job.get("gate_cases", ("public", "stress"))),
        gate=judge,
        **tolerance,
    )
    shares = [c.get("noise_share") for c in cases.values() if c.get("noise_share") is not None]
    result = {
        "check": cases,
        "gate": judge.name if judge else "course",
        "max_abs_err": max(c["max_abs_err"] for c in cases.values()),
        "tol_share": max(c["tol_share"] for c in cases.values()),
        "noise_share": max(shares) if shares else None,
    }
    failed = [f"{name}: {c['failure']}" for name, c in cases.items() if not c["passed"]]
    if failed:
        crash = any(_crashed(c["failure"]) for c in cases.values() if not c["passed"])
        return {
            **result,
            "status": "failed" if crash else "infeasible",
            "reason": "; ".join(failed),
        }
    limit = job.get("tol_share_limit", TOL_SHARE_LIMIT)
    if result["gate"] == "course" and result["tol_share"] > limit:
        reason = f"uses {result['tol_share']:.2f} of the tolerance (limit {limit})"
        return {**result, "status": "infeasible", "reason": reason}
    return {**result, "status": "ok", "reason": None}


def measure(create_engine, job: dict) -> dict:
    from evaluator.benchmark_traces import get_trace

    per_trace = {}
    for name in job["traces"]:
        trace = get_trace(name, job["config"])
        timing = time_one(create_engine, job, trace, full=job["protocol"] == "full")
        timing["floor_eff"] = _floor_efficiency(
            trace, job["config"], job["device"], job.get("ceilings"), timing["seconds"]
        )
        per_trace[name] = timing
        log.info("%s: %.1f tokens/s", name, timing["tokens_per_s"])
    return per_trace


def time_one(create_engine, job: dict, trace, full: bool) -> dict:
    """Full: the grader's protocol. Quick: one engine, one warm-up, one timed pass, and two more
    passes (on a second engine) only when a pass is short enough for noise to matter: on an H200
    a pass of the continuous trace takes about 0.4 s (seconds with a slow engine), the public
    ones a few milliseconds; on a CPU a pass takes seconds."""
    from evaluator.benchmark import time_trace

    args = (create_engine, job["config"], job["weight_dir"], job["device"], trace)
    if full:
        return time_trace(*args, warmup=1, repeat=3, fresh_engine=True)
    timing = time_trace(*args, warmup=1, repeat=1, fresh_engine=False)
    if timing["seconds"] >= QUICK_LONG_PASS_S:
        return timing
    more = time_trace(*args, warmup=0, repeat=2, fresh_engine=False)
    seconds = statistics.median(timing["all_seconds"] + more["all_seconds"])
    tokens = timing["prefill_tokens"] + timing["decode_tokens"]
    return {
        **timing,
        "seconds": seconds,
        "all_seconds": timing["all_seconds"] + more["all_seconds"],
        "tokens_per_s": tokens / seconds,
        "decode_tokens_per_s": timing["decode_tokens"] / seconds,
        "peak_mib": max(timing["peak_mib"], more["peak_mib"]),
        "engines_built": timing.get("engines_built", 1) + more.get("engines_built", 1),
    }


def _floor_efficiency(trace, config: dict, device: str, ceilings, seconds: float):
    if not ceilings:
        return None
    try:
        from evaluator.floor import (
            Ceilings,
            dtype_bytes_for,
            floor_efficiency,
            trace_floor_seconds,
        )

        floor = trace_floor_seconds(
            trace, config, Ceilings(**ceilings), dtype_bytes_for(config, device)
        )
        return floor_efficiency(floor, seconds)
    except Exception as exc:  # the floor model is a diagnostic; it never fails a trial
        log.warning("floor efficiency unavailable: %s", exc)
        return None


def grader_peak(create_engine, job: dict, per_trace: dict) -> float:
    """The peak (MiB) of the trace that took the most memory, in the grader's pattern (a
    warm-up engine and two repeats: three engines alive while the last is built); the full
    protocol measured every trace that way already."""
    from evaluator.benchmark import time_trace
    from evaluator.benchmark_traces import get_trace

    if job["protocol"] == "full":
        return max(t["peak_mib"] for t in per_trace.values())
    name = max(per_trace, key=lambda n: per_trace[n]["peak_mib"])
    trace = get_trace(name, job["config"])
    args = (create_engine, job["config"], job["weight_dir"], job["device"], trace)
    return time_trace(*args, warmup=1, repeat=2, fresh_engine=True)["peak_mib"]


def over_budget(peak_mib: float, job: dict) -> str | None:
    budget = job.get("memory_budget_mib")
    if budget is None or peak_mib <= budget:
        return None
    return (
        f"peak {peak_mib:.0f} MiB in the grader's pattern (a warm-up engine and two repeats "
        f"alive) is over the memory budget of {budget:.0f} MiB"
    )


def run_job(job: dict, phases: Phases) -> dict:
    from evaluator.engine_loader import load_engine_module
    from variants.variant import Variant

    variant = Variant.from_dict(job["variant"])
    phases.enter("render")
    render = load_renderer(job.get("renderer") or DEFAULT_RENDERER)
    engine_path = Path(job["engine_path"])
    render(variant, engine_path, job.get("header", ""), job.get("engine_budget_gib"))
    phases.enter("import")
    create_engine = load_engine_module(engine_path).create_engine
    # What is loaded now (torch, Triton, the engine's module) lives as long as the process: out
    # of the cyclic collector's sight. The benchmark collects before and after each trace, 12-16
    # times a trial, and each collection walked every object (about 200 ms on the development
    # CPU with torch loaded; a few ms once these are frozen).
    gc.freeze()
    result: dict = {"status": "ok", "reason": None}
    if job.get("check", True):
        phases.enter("correctness")
        result = gate(create_engine, job)
        if result["status"] != "ok":
            return result
    phases.enter("benchmark")
    result["traces"] = measure(create_engine, job)
    if result["traces"]:  # (a kernel warm-up times nothing)
        phases.enter("memory")
        result["grader_peak_mib"] = grader_peak(create_engine, job, result["traces"])
        if (reason := over_budget(result["grader_peak_mib"], job)) is not None:
            result.update(status="infeasible", reason=reason)
    return result


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
        print("usage: python -m search.trial_worker JOB.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    output = Path(job["output"])
    start = time.perf_counter()
    try:
        result = run_job(job, Phases(output))
    except Exception as exc:
        traceback.print_exc()
        result = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
    result["worker_seconds"] = time.perf_counter() - start
    tmp = output.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, default=str, allow_nan=True))
    tmp.replace(output)
    return 0


if __name__ == "__main__":
    stop_with_parent()
    code = main()
    # The result is on disk: skip interpreter teardown (seconds with torch and an engine loaded).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
