"""Time an engine on a trace exactly the way the grader does, in the grader's memory pattern.

The grader builds one warm-up engine and runs the trace on it untimed; it stays alive for the
whole case. Each repeat then builds a FRESH engine (built untimed, its seconds recorded) by plain
assignment over the last one, so the last one is still alive while the new one is built, and
nothing is collected in between. Only the prefill/decode/remove calls are timed, between device
synchronisations, under `torch.no_grad()`, with token tensors already on the device. Median wins.
"""

from __future__ import annotations

import contextlib
import gc
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable

import torch

from evaluator.traces import Trace, materialize


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_calls(engine, calls: list) -> None:
    """Replay materialized calls on `engine` (no timing, no checks)."""
    for call in calls:
        kind = call[0]
        if kind == "prefill":
            engine.prefill(call[1], call[2])
        elif kind == "decode":
            engine.decode(call[1], call[2])
        else:
            engine.remove(call[1])


def _reset_peak(device: torch.device) -> None:
    """Start a case's peak: CUDA's peak counter, or the process's peak RSS where Linux allows
    (writing 5 to /proc/self/clear_refs resets VmHWM to the current RSS)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**10  # KiB
    except (OSError, ValueError, IndexError):
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes vs KiB


def time_trace(
    create_engine: Callable,
    config: dict,
    weight_dir: str | os.PathLike,
    device: str | torch.device,
    trace: Trace,
    warmup: int = 1,
    repeat: int = 3,
    fresh_engine: bool = True,
    seed: int = 0,
    quiet: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> dict:
    """Median seconds of the engine calls of `trace`, and the derived rates.

    `fresh_engine=True` is the grader's pattern (module docstring): a warm-up engine, alive to
    the end, then an engine per repeat by assignment; the cyclic collector is off meanwhile,
    so an engine that only a reference cycle would free stays, as it does for the grader.
    `fresh_engine=False` runs warm-up and repeats on the one warm-up engine (a cheap screening
    mode; the trace must leave no request live, which all traces here do).
    `peak_mib` is the case's peak: `torch.cuda.max_memory_allocated` on CUDA (everything the
    process allocated, as the grader reads it), the process's peak RSS elsewhere (`peak_kind`).
    `quiet`: a context the repeats run in (a caller's other work held still while it times),
    entered after the warm-up engine's build and passes.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    device = torch.device(device)
    calls = materialize(trace, int(config["vocab_size"]), device, seed)
    create_s: list[float] = []

    def build():
        start = time.perf_counter()
        engine = create_engine(config, str(weight_dir), str(device))
        _sync(device)
        create_s.append(time.perf_counter() - start)
        return engine

    seconds: list[float] = []
    collecting = gc.isenabled()
    _release(device)  # what earlier cases left is not this case's
    _reset_peak(device)
    gc.disable()
    try:
        with torch.no_grad():
            warm = build()
            for _ in range(warmup):
                run_calls(warm, calls)
                _sync(device)
            engine = warm
            with quiet() if quiet is not None else contextlib.nullcontext():
                for _ in range(repeat):
                    if fresh_engine:
                        engine = build()  # the last repeat's engine lives until this returns
                    _sync(device)
                    start = time.perf_counter()
                    run_calls(engine, calls)
                    _sync(device)
                    seconds.append(time.perf_counter() - start)
        peak = _peak_mib(device)
    finally:
        engine = warm = None
        if collecting:
            gc.enable()
    _release(device)

    median = statistics.median(seconds)
    tokens = trace.prefill_tokens + trace.decode_tokens
    return {
        "trace": trace.name,
        "seconds": median,
        "all_seconds": seconds,
        "tokens_per_s": tokens / median,
        "decode_tokens_per_s": trace.decode_tokens / median,
        "prefill_tokens": trace.prefill_tokens,
        "decode_tokens": trace.decode_tokens,
        "peak_mib": peak,
        "peak_kind": "cuda_max_allocated" if device.type == "cuda" else "process_max_rss",
        "pattern": "grader" if fresh_engine else "one engine",
        "create_s": statistics.median(create_s),
        "engines_built": len(create_s),
    }
