"""Engines measured over shapes: decode step time against batch size, prefill tokens/s against
prompt length, each next to the floor of evaluator/floor.py's cost model.

Every variant gets a fresh engine (`variants.build.build_engine`, the library, no rendering),
measured by `search.shape_measure` over the shapes, inside an optional time limit. The result is
plain JSON-able data (see `sweep`).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import torch

from evaluator.floor import Ceilings, CostModel, dtype_bytes_for, measure_ceilings
from search.shape_measure import Shapes
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
    build: Callable | None = None,
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
    if build is None:
        from variants.build import build_engine as build
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
