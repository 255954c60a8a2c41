"""The shape sweep: engines measured over shapes, decode step time against batch size and prefill
tokens/s against prompt length, each next to the floor of evaluator/floor.py's cost model.

Every variant gets a fresh engine (`variants.build.build_engine`: rendered and imported as a
trial's).
Decode: B requests (random ids, fixed seed) prefilled so that the first timed step runs at the
given context, `warmup` untimed steps, then `decode_repeats` timed steps; the median is kept and
the requests are removed before the next batch size. Prefill: one prompt of each length,
re-prefilled under the same id (a re-prefill replaces), one untimed call, then the median of
`prefill_repeats` calls. Each call is timed alone: torch.cuda.synchronize() on both sides on
CUDA, time.perf_counter throughout. The result is plain JSON-able data (see `sweep`).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from evaluator.floor import Ceilings, CostModel, dtype_bytes_for, measure_ceilings
from variants.build import build_engine
from variants.variant import Variant

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_CONTEXT = 256
DEFAULT_LENGTHS = (16, 64, 128, 256, 512, 1024, 2048, 4096)
DEFAULT_DECODE_REPEATS = 20
DEFAULT_PREFILL_REPEATS = 5
DEFAULT_WARMUP = 3


def decode_context(config: dict, context: int, warmup: int, repeats: int) -> int:
    """The context of the first timed step (new token included), lowered so that the last
    timed step stays within max_position_embeddings and raised so the prompt is not empty."""
    limit = config["max_position_embeddings"] - repeats + 1
    return max(min(context, limit), warmup + 2)


def prefill_lengths(config: dict, lengths) -> list[int]:
    """The lengths, each capped at max_position_embeddings, sorted, without duplicates."""
    return sorted({min(int(n), config["max_position_embeddings"]) for n in lengths if n > 0})


def environment(device: str) -> dict:
    dev = torch.device(device)
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else None
    return {
        "device": device,
        "torch": torch.__version__,
        "gpu": gpu,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def sweep(
    config: dict,
    weight_dir: str,
    device: str,
    variants: list[tuple[str, Variant]],
    *,
    batches=DEFAULT_BATCHES,
    context: int = DEFAULT_CONTEXT,
    lengths=DEFAULT_LENGTHS,
    decode_repeats: int = DEFAULT_DECODE_REPEATS,
    prefill_repeats: int = DEFAULT_PREFILL_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    time_limit_s: float | None = None,
    ceilings: Ceilings | dict | None = None,
    floor: bool = True,
    seed: int = 0,
    build: Callable = build_engine,
    progress: Callable[[str], None] = lambda line: None,
    on_variant: Callable[[dict], None] | None = None,
) -> dict:
    """Measure each `(name, variant)` over the shapes; returns

    {"device", "torch", "gpu", "date", "model_config", "settings", "floor",
     "variants": [{"name", "variant": {...}, "decode": [{"batch", "context", "step_ms",
                   "min_ms", "tokens_per_s", "floor_ms"}],
                   "prefill": [{"length", "seconds", "tokens_per_s", "floor_tokens_per_s"}],
                   "skipped": [...], "error": str (only when the engine failed)}]}

    `time_limit_s`: stop adding shapes once it is spent; the time is shared out in equal parts
    (decode, then prefill, of each variant in turn; time a part leaves over goes to the next),
    each part measures at least its first shape, and a later variant whose share is already
    spent is not built (engine builds count: torch.compile can take a minute).
    `on_variant(result)` is called with the partial result after each variant (to write it as it
    goes). Floor values are None when `floor` is False or the ceilings cannot be measured.
    """
    dev = torch.device(device)
    context = decode_context(config, context, warmup, decode_repeats)
    lengths = prefill_lengths(config, lengths)
    batches = sorted({int(b) for b in batches if b > 0})
    result = environment(device)
    result["model_config"] = config
    result["settings"] = {
        "batches": batches,
        "context": context,
        "lengths": lengths,
        "decode_repeats": decode_repeats,
        "prefill_repeats": prefill_repeats,
        "warmup": warmup,
        "time_limit_s": time_limit_s,
        "seed": seed,
    }
    cost, ceilings, result["floor"] = (
        _floor_model(config, device, ceilings, progress) if floor else (None, None, None)
    )
    result["variants"] = []
    shapes = Shapes(
        config, dev, batches, context, lengths, warmup, decode_repeats, prefill_repeats,
        cost, ceilings, progress, width=max((len(name) for name, _ in variants), default=0),
    )  # fmt: skip

    start = time.monotonic()
    parts = 2 * max(len(variants), 1)

    def deadline(part: int) -> float:
        return float("inf") if time_limit_s is None else start + time_limit_s * (part + 1) / parts

    for i, (name, variant) in enumerate(variants):
        entry = {"name": name, "variant": variant.to_dict(), "decode": [], "prefill": []}
        entry["skipped"] = []
        result["variants"].append(entry)
        if i and time.monotonic() > deadline(2 * i):
            entry["skipped"].append({"kind": "engine", "why": "time limit"})
            progress(f"{name}: not built, the time limit is spent")
            continue
        gen = torch.Generator().manual_seed(seed)
        engine = None
        try:
            t0 = time.perf_counter()
            engine = build(config, weight_dir, device, variant)
            entry["create_s"] = time.perf_counter() - t0
            shapes.decode(engine, entry, gen, deadline(2 * i))
            shapes.prefill(engine, entry, gen, deadline(2 * i + 1))
        except Exception as exc:  # one broken engine does not end the sweep
            entry["error"] = f"{type(exc).__name__}: {exc}"
            progress(f"{name}: {entry['error']}")
        finally:
            del engine
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        if on_variant is not None:
            on_variant(result)
    result["seconds"] = time.monotonic() - start
    return result


def _floor_model(config: dict, device: str, ceilings, progress):
    """(CostModel, Ceilings, a description for the JSON), or Nones when the ceilings cannot be
    measured. Bytes per element: the reference's compute dtype there, as the trials' floor."""
    try:
        if ceilings is None:
            ceilings = measure_ceilings(device)
        elif isinstance(ceilings, dict):
            ceilings = Ceilings(**ceilings)
        dtype_bytes = dtype_bytes_for(config, device)
    except Exception as exc:  # the floor is a diagnostic
        progress(f"no floor: {exc!r}")
        return None, None, None
    about = {
        "ceilings": ceilings.to_dict(),
        "dtype_bytes": dtype_bytes,
        "model": "evaluator/floor.py: max(FLOPs / peak FLOP/s, bytes / bandwidth) per call",
    }
    return CostModel.from_config(config, dtype_bytes), ceilings, about


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
