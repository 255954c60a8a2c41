"""Shapes measured on one engine: decode step time at a batch size, prefill time at a prompt
length, each point with the floor of evaluator/floor.py's cost model when one is given.

Decode: B requests (random ids, fixed seed) prefilled so that the first timed step runs at the
given context, `warmup` untimed steps, then `decode_repeats` timed steps; the median is kept and
the requests are removed before the next batch size. Prefill: one prompt of each length,
re-prefilled under the same id (a re-prefill replaces), one untimed call, then the median of
`prefill_repeats` calls. Each call is timed alone: torch.cuda.synchronize() on both sides on
CUDA, time.perf_counter throughout.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from evaluator.floor import Ceilings, CostModel

PREFILL_ID = 1_000_000  # decode batches use ids 0..B-1


def _seconds(fn, device: torch.device) -> float:
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _random_ids(gen: torch.Generator, vocab: int, n: int, device) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=gen).to(device)


def measure_decode(engine, config, device, batch, context, warmup, repeats, gen) -> dict:
    """Median seconds of one decode step of `batch` requests at `context`."""
    vocab = config["vocab_size"]
    ids = list(range(batch))
    prompts = [_random_ids(gen, vocab, context - 1 - warmup, device) for _ in ids]
    tokens = [_random_ids(gen, vocab, batch, device) for _ in range(warmup + repeats)]
    engine.prefill(ids, prompts)
    try:
        for t in tokens[:warmup]:
            engine.decode(ids, t)
        times = [_seconds(lambda t=t: engine.decode(ids, t), device) for t in tokens[warmup:]]
    finally:
        engine.remove(ids)
    return {"seconds": statistics.median(times), "min_seconds": min(times)}


def measure_prefill(engine, config, device, length, repeats, gen) -> float:
    """Median seconds of one prefill call of one prompt of `length` tokens."""
    prompt = _random_ids(gen, config["vocab_size"], length, device)
    engine.prefill([PREFILL_ID], [prompt])  # first call at this shape: not timed
    try:
        times = [
            _seconds(lambda: engine.prefill([PREFILL_ID], [prompt]), device) for _ in range(repeats)
        ]
    finally:
        engine.remove([PREFILL_ID])
    return statistics.median(times)


def _out_of_memory(exc: Exception) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc)


@dataclass
class Shapes:
    """The shapes of one sweep and how to measure them on an engine."""

    config: dict
    device: torch.device
    batches: list[int]
    context: int
    lengths: list[int]
    warmup: int
    decode_repeats: int
    prefill_repeats: int
    cost: CostModel | None
    ceilings: Ceilings | None
    progress: Callable[[str], None]
    width: int = 28  # of the name column in the progress lines

    def decode(self, engine, entry: dict, gen: torch.Generator, until: float) -> None:
        ctx, repeats = self.context, self.decode_repeats
        for n, batch in enumerate(self.batches):
            if n and time.monotonic() > until:
                entry["skipped"].append({"kind": "decode", "batch": batch, "why": "time limit"})
                continue
            try:
                m = measure_decode(
                    engine, self.config, self.device, batch, ctx, self.warmup, repeats, gen
                )
            except Exception as exc:
                if not _out_of_memory(exc):
                    raise
                entry["skipped"].append({"kind": "decode", "batch": batch, "why": "out of memory"})
                break
            floor_ms = None
            if self.cost is not None:  # the mean over the timed steps' contexts
                floors = [
                    self.floor_s(self.cost.decode((ctx + k,) * batch)) for k in range(repeats)
                ]
                floor_ms = 1e3 * statistics.mean(floors)
            point = {
                "batch": batch,
                "context": ctx,
                "step_ms": 1e3 * m["seconds"],
                "min_ms": 1e3 * m["min_seconds"],
                "tokens_per_s": batch / m["seconds"],
                "floor_ms": floor_ms,
            }
            entry["decode"].append(point)
            floor = "" if floor_ms is None else f"  (floor {floor_ms:.3f} ms)"
            self.progress(
                f"{entry['name']:<{self.width}s} decode   batch {batch:>4d} ctx {ctx:>5d}  "
                f"{point['step_ms']:9.3f} ms/step  {point['tokens_per_s']:12,.1f} tok/s{floor}"
            )

    def prefill(self, engine, entry: dict, gen: torch.Generator, until: float) -> None:
        for n, length in enumerate(self.lengths):
            if n and time.monotonic() > until:
                entry["skipped"].append({"kind": "prefill", "length": length, "why": "time limit"})
                continue
            try:
                seconds = measure_prefill(
                    engine, self.config, self.device, length, self.prefill_repeats, gen
                )
            except Exception as exc:
                if not _out_of_memory(exc):
                    raise
                why = "out of memory"
                entry["skipped"].append({"kind": "prefill", "length": length, "why": why})
                break
            floor_tps = None
            if self.cost is not None:
                floor_tps = length / self.floor_s(self.cost.prefill((length,)))
            point = {
                "length": length,
                "seconds": seconds,
                "tokens_per_s": length / seconds,
                "floor_tokens_per_s": floor_tps,
            }
            entry["prefill"].append(point)
            floor = "" if floor_tps is None else f"  (floor {floor_tps:,.0f} tok/s)"
            self.progress(
                f"{entry['name']:<{self.width}s} prefill  length {length:>5d}        "
                f"{1e3 * seconds:9.3f} ms/call  {point['tokens_per_s']:12,.1f} tok/s{floor}"
            )

    def floor_s(self, flops_bytes: tuple[float, float]) -> float:
        """max(FLOPs / peak FLOP/s, bytes / bandwidth): trace_floor_seconds for one call."""
        flops, moved = flops_bytes
        c = self.ceilings
        return max(flops / (c.tflops * 1e12), moved / (c.bandwidth_gbs * 1e9))
