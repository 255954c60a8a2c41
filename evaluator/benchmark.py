"""Time an engine on a trace exactly the way the grader does.

Warm-up engines run the trace untimed; then each repeat builds a FRESH engine (built untimed, its
seconds recorded), and only the prefill/decode/remove calls are timed, between device
synchronisations, under `torch.no_grad()`, with token tensors already on the device. Median wins.
"""

from __future__ import annotations

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


def _peak_rss_mib() -> float:
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
) -> dict:
    """Median seconds of the engine calls of `trace`, and the derived rates.

    `fresh_engine=False` builds one engine and reuses it for warm-up and repeats (a cheap
    screening mode; the trace must leave no request live, which all traces here do).
    `peak_mib` is `torch.cuda.max_memory_allocated` over building and running on CUDA, the
    process's peak RSS elsewhere (`peak_kind` says which).
    """
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    device = torch.device(device)
    calls = materialize(trace, int(config["vocab_size"]), device, seed)
    on_cuda = device.type == "cuda"
    peak = 0.0
    create_s: list[float] = []
    engine = None

    def build():
        nonlocal engine
        engine = None
        _release(device)
        if on_cuda:
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        engine = create_engine(config, str(weight_dir), str(device))
        _sync(device)
        create_s.append(time.perf_counter() - start)

    def record_peak():
        nonlocal peak
        if on_cuda:
            peak = max(peak, torch.cuda.max_memory_allocated(device) / 2**20)

    seconds: list[float] = []
    with torch.no_grad():
        for _ in range(warmup):
            if fresh_engine or engine is None:
                build()
            run_calls(engine, calls)
            _sync(device)
            record_peak()
        for _ in range(repeat):
            if fresh_engine or engine is None:
                build()
            _sync(device)
            start = time.perf_counter()
            run_calls(engine, calls)
            _sync(device)
            seconds.append(time.perf_counter() - start)
            record_peak()
    engine = None
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
        "peak_mib": peak if on_cuda else _peak_rss_mib(),
        "peak_kind": "cuda_max_allocated" if on_cuda else "process_max_rss",
        "create_s": statistics.median(create_s),
        "engines_built": len(create_s),
    }
