"""The decode attention's launch searched at the target's shapes on this GPU.

A decode graph fixes the split-K kernel's launch (its splits, tiles, warps, how it cuts a head,
a register cap) for its (rows, context) bucket. The hand rules (kernels/decode_attention_rules.py)
were measured on one GPU and one model; here each bucket the traces reach is timed on the GPU at
hand, at the live lengths the traces give it, and its knobs are searched coordinate by
coordinate from a prior: the hand rules, or the neutral defaults (the rules' branch for a GPU
nothing was measured on). Every candidate must match a float32 reference before it is timed.

The result, a table (rows, context) -> launch, is cached per GPU, model shape, cache layout and
Triton version (`cache_path`), bound to the attention as `knobs` and written into engine.py as
constants; its context buckets become the decode graphs' own.

    python -m tuning.decode_attention [--config target/model_config.json]
        [--weight-dir target/weights] [--preset NAME | --variant JSON] [--prior hand|neutral]
        [--budget 120] [--cache-dir studies/kernels] [--json table.json]
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import itertools
import json
import math
import platform
import statistics
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from evaluator.benchmark_traces import SUITES
from evaluator.traces import Decode, replay
from variants.build import build_engine
from variants.execution.cuda_graphs import batch_buckets
from variants.kernels.decode_attention import paged_decode_attention
from variants.kernels.decode_attention_rules import (
    choose_num_splits,
    default_max_registers,
    default_parts,
    default_prefetch_tiles,
    default_tiles,
    graph_context_buckets,
    long_split_programs,
    split_tokens_for,
)
from variants.kernels.device import device_capability, device_sm_count
from variants.kernels.prefill_attention import head_parts
from variants.presets import PRESETS
from variants.spec import ModelSpec
from variants.variant import Variant

# (BLOCK_N, warps, stages) tried for every bucket; the prior's own is tried first
TILES = ((16, 1, 2), (16, 2, 2), (32, 1, 2), (32, 2, 2), (32, 4, 2), (64, 4, 2))
# a candidate replaces the best so far only when it is faster by more than this share
MARGIN = 0.01
NEUTRAL = (0, 0)  # the capability the rules take for a GPU nothing was measured on
# threads that build a knob's candidates side by side (Triton's compiler releases the GIL)
BUILD_THREADS = 8


@dataclass(frozen=True)
class Bucket:
    """A decode graph's (rows, context) bucket, the live lengths it is timed at (the median step
    by weight the traces run in it), how many steps of the traces fall in it and its weight: the
    sum over the traces of the share of each one's decode steps it holds (the objective is the
    traces' geometric mean, where every trace counts alike)."""

    rows: int
    context: int
    lengths: tuple
    steps: int = 0
    weight: float = 0.0


@dataclass
class Tuned:
    """What the search found for one bucket: the prior's launch and time, the best's."""

    bucket: Bucket
    prior: dict
    best: dict
    prior_ms: float
    best_ms: float
    tried: int = 0
    rejected: list = field(default_factory=list)

    @property
    def moved(self) -> dict:
        return {k: v for k, v in self.best.items() if self.prior.get(k) != v}

    def outcome(self) -> str:
        """The log's account: the time from the prior to the best, and what moved."""
        moved = ", ".join(f"{k}={v}" for k, v in self.moved.items()) or "prior kept"
        return (f"{self.prior_ms * 1e3:7.1f} -> {self.best_ms * 1e3:7.1f} us, {self.tried} "
                f"tried: {moved}")  # fmt: skip


def prior_launch(spec: ModelSpec, rows: int, context: int, sm_count: int, capability) -> dict:
    """The launch the rules pick for a bucket, every knob explicit (the launcher's defaults)."""
    splits = choose_num_splits(context, rows, spec.num_kv_heads, sm_count, capability)
    block_d = max(16, 1 << (spec.head_dim - 1).bit_length())
    tiles = default_tiles(rows, spec.num_kv_heads, block_d, sm_count, capability, splits)
    cap = default_max_registers(tiles, rows, spec.num_kv_heads, splits, sm_count, capability)
    return {
        "num_splits": splits,
        "tiles": tiles,
        "split_tokens": split_tokens_for(tiles[0]),
        "parts": default_parts(spec.head_dim, rows, spec.num_kv_heads, sm_count, capability),
        "min_programs": long_split_programs(rows, spec.num_kv_heads, sm_count, capability),
        "max_registers": cap or 0,
        "prefetch_tiles": default_prefetch_tiles(rows, spec.num_kv_heads, splits, capability),
    }


def graph_buckets(spec: ModelSpec, capability, policy: str = "pow2", largest: int = 64,
                  contexts=None):  # fmt: skip
    """The (rows, context) buckets the decode graphs capture under the rules for `capability`
    (or at `contexts`)."""
    contexts = contexts or graph_context_buckets(spec.max_positions, capability)
    return [(b, c) for c in contexts for b in batch_buckets(policy, largest)]


def trace_contexts(config: dict, most: int) -> list:
    """The decode graphs' context buckets where no rule was measured (the neutral prior):
    `most` (the model's positions) and below it the power of two that pads the traces' decode
    steps least, each step's longest row counted up to its bucket in doublings, each trace
    weighing 1 (as in `trace_buckets`). With one bucket a row count's grid is searched at its
    median step and its long steps run a grid sized for short ones (docs/PERF.md)."""
    steps = []  # (a step's longest row, its trace's share)
    for suite in SUITES.values():
        for trace in suite(config):
            longest = [max(lengths) for op, lengths in replay(trace) if isinstance(op, Decode)]
            steps += [(n, 1 / len(longest)) for n in longest]

    def padding(cut: int) -> float:
        return sum(w * math.log2((cut if n <= cut else most) / n) for n, w in steps)

    cuts = [1 << k for k in range(4, most.bit_length()) if 1 << k < most]
    cut = min(cuts, key=padding, default=most)
    return [cut, most] if padding(cut) < padding(most) else [most]


def trace_buckets(config: dict, buckets: list) -> list:
    """The buckets the timed traces' decode steps fall in, the heaviest first (`Bucket`), each
    at the live lengths of its median step by weight (by longest row: half the bucket's weight
    runs no longer a row), so a trace of few steps counts in a bucket as much as its weight
    says, not as few steps as it has."""
    steps, weight = defaultdict(list), defaultdict(float)
    for suite in SUITES.values():
        for trace in suite(config):
            found = []
            for op, lengths in replay(trace):
                if not isinstance(op, Decode):
                    continue
                fits = [(b, c) for b, c in buckets if b >= len(lengths) and c >= max(lengths)]
                if fits:
                    found.append((min(fits, key=lambda k: (k[1], k[0])), tuple(lengths)))
            for key, lengths in found:
                steps[key].append((max(lengths), 1 / len(found), lengths))
                weight[key] += 1 / len(found)
    found = []
    for (rows, context), seen in steps.items():
        seen.sort(key=lambda step: step[0])
        shares = itertools.accumulate(w for _, w, _ in seen)
        median = next(i for i, share in enumerate(shares) if share >= weight[rows, context] / 2)
        found.append(
            Bucket(rows, context, seen[median][2], len(seen), weight[rows, context])
        )  # fmt: skip
    return sorted(found, key=lambda k: (-k.weight, -k.steps))


def candidates(axis: str, current: dict, spec: ModelSpec, bucket: Bucket, sm_count: int) -> list:
    """The values one coordinate takes, the current one first."""
    block_n = current["tiles"][0]
    if axis == "tiles":
        values = list(TILES)
    elif axis == "num_splits":
        s = current["num_splits"]
        most = max(1, min(64, bucket.context // 16))
        values = sorted({max(1, min(most, v)) for v in (s // 4, s // 2, s * 2, s * 4, 16)})
    elif axis == "split_tokens":
        values = [block_n, 2 * block_n, 4 * block_n]
    elif axis == "parts":
        padded = (max(16, 1 << (spec.head_dim - 1).bit_length()), 0)
        values = [padded, head_parts(spec.head_dim)]
    elif axis == "max_registers":
        values = [0, 128, 168]
    elif axis == "prefetch_tiles":  # tiles a split prefetches into L2 before its PDL wait
        values = [0, 1, 2, 4]
    else:  # min_programs: splits grow while this many programs work (0: never)
        values = [0, 5 * sm_count]
    first = current[axis]
    return [first] + [v for v in values if v != first]


# the knobs in the order they are searched; the prefetch only where the launch uses PDL
AXES = ("tiles", "num_splits", "split_tokens", "parts", "max_registers", "min_programs")
PDL_AXES = (*AXES, "prefetch_tiles")


class KernelCheck:
    """One bucket's inputs for the kernel alone, checked against a float32 reference."""

    def __init__(self, spec: ModelSpec, bucket: Bucket, layout: str, pdl: bool, device, dtype):
        gen = torch.Generator().manual_seed(0)
        on_device = torch.Generator(device).manual_seed(0)
        self.device, self.pdl, self.spec = device, pdl, spec
        rows, ctx, kvh, d = bucket.rows, bucket.context, spec.num_kv_heads, spec.head_dim
        lengths = list(bucket.lengths) + [1] * (rows - len(bucket.lengths))  # padding rows
        # a slab's table holds each row's first token slot (`offsets`), a paged one blocks
        self.offsets = layout == "slab"
        self.block = ctx if self.offsets else int(layout.removeprefix("paged"))
        width = -(-ctx // self.block)
        table = torch.randperm(rows * width, generator=gen).view(rows, width)
        self.table = (table * self.block if self.offsets else table).to(device, torch.int32)
        self.lens = torch.tensor(lengths, dtype=torch.int32, device=device)
        shape = (rows * width * self.block, kvh, d)
        self.k, self.v = (
            torch.randn(shape, generator=on_device, device=device, dtype=dtype) for _ in "kv"
        )
        self.q = torch.randn(rows, spec.num_heads, d, generator=gen).to(device, dtype)
        self.scale = 1.0 / math.sqrt(d)
        self.want = self._reference()

    def _reference(self) -> torch.Tensor:
        """Each row's attention over its live tokens, in float32."""
        group = self.spec.num_heads // self.spec.num_kv_heads
        out = torch.zeros(self.q.shape, dtype=torch.float32, device=self.device)
        for r, n in enumerate(self.lens.tolist()):
            blocks = self.table[r].long()[:, None] * (1 if self.offsets else self.block)
            slots = (blocks + torch.arange(self.block, device=self.device)).flatten()[:n]
            k = self.k[slots].float().repeat_interleave(group, dim=1)  # [n, heads, d]
            v = self.v[slots].float().repeat_interleave(group, dim=1)
            w = torch.einsum("hd,nhd->hn", self.q[r].float(), k) * self.scale
            out[r] = torch.einsum("hn,nhd->hd", w.softmax(-1), v)
        return out

    def run(self, launch: dict) -> torch.Tensor:
        return paged_decode_attention(
            self.q, self.k, self.v, self.table, self.lens, self.block, self.scale, **launch,
            pdl=self.pdl, offsets=self.offsets,
        )  # fmt: skip

    def error(self, launch: dict) -> float:
        """The launch's largest error against the float32 reference."""
        return float((self.run(launch).float() - self.want).abs().max())


class StepBench:
    """A launch timed where it runs: the engine's decode step for the bucket (its CUDA graph,
    every layer and the kernels around the attention), captured with the launch at the
    bucket's live lengths and replayed back to back; its correctness from `check`. The launch
    goes into `table` at `key` (default: the attention's knobs at the bucket's), a table the
    engine reads when it captures."""

    def __init__(self, engine, bucket: Bucket, check, vocab: int, table=None, key=None):
        self.engine, self.bucket, self.check = engine, bucket, check
        self.table = engine.model.attention.knobs if table is None else table
        self.key = (bucket.rows, bucket.context) if key is None else key
        gen = torch.Generator().manual_seed(bucket.rows * 10_000 + bucket.context)
        self.ids = list(range(1 << 20, (1 << 20) + len(bucket.lengths)))
        device = engine.device
        draw = lambda n: torch.randint(0, vocab, (n,), generator=gen).to(device)  # noqa: E731
        self.prompts = [draw(max(1, n - 1)) for n in bucket.lengths]
        self.tokens = draw(len(self.ids))

    def error(self, launch: dict) -> float:
        return self.check.error(launch)

    def build(self, launch: dict) -> None:
        """The launch's kernels compiled (run once on the check's inputs, the result dropped)."""
        self.check.run(launch)

    def time_ms(self, launch: dict, replays: int = 30, rounds: int = 3) -> float:
        """The median GPU time of one decode step with `launch` at this bucket. The bucket's
        prompts are prefilled once; each later launch first undoes the last one's step (as the
        engine undoes a refused step), so every launch runs at the same lengths without a
        prefill of its own (at 32 rows x 4096 a prefill cost more than the step's timing)."""
        e, key = self.engine, (self.bucket.rows, self.bucket.context)
        self.table[self.key] = launch
        if all(r in e.lengths for r in self.ids):
            for rid in self.ids:
                e.lengths[rid] -= 1
                e.cache.truncate(rid, e.lengths[rid])
        else:
            e.prefill(self.ids, self.prompts)
        # Captured again, with this launch. The old graph is released only after: where it is
        # its pool's last (the prefill moved the cache, so the runner captures into a new pool
        # as calls need it), a capture into a pool with no graph alive but its outputs trips
        # torch's allocator (an internal assert, torch 2.11).
        stale = e.decode_runner.graphs.pop(key, None)
        e.decode(self.ids, self.tokens)
        del stale
        return replay_ms(e.decode_runner.graphs[key], replays, rounds)


def replay_ms(graph, replays: int = 30, rounds: int = 3) -> float:
    """The median GPU time (CUDA events) of one replay of `graph`, over `rounds` rounds of
    `replays` back to back."""
    times = []
    for _ in range(rounds):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / replays)
    return statistics.median(times)


def share_deadline(now: float, deadline: float, buckets: list) -> float:
    """The first of `buckets`' deadline: its weight's share of the time left to them all (what
    it leaves goes to the next), so a budget that cannot finish the heaviest bucket still
    reaches the others in proportion."""
    total = sum(b.weight for b in buckets)
    share = buckets[0].weight / total if total > 0 else 1.0 / len(buckets)
    return now + share * max(0.0, deadline - now)


def knobs_at(axis, value) -> dict:
    """An axis's knobs at `value`: one knob, or several moved together (a tuple of their names,
    a tuple of values)."""
    return dict(zip(axis, value)) if isinstance(axis, tuple) else {axis: value}


def nearest_found(results: list, size, at: float, most: int = 2) -> tuple:
    """The launches the search found where they moved (`results`: Tuned), the buckets nearest
    to size `at` first (`size` of a bucket, compared in doublings): a neighbour's best is a
    better start than a prior of no measurement (from the neutral prior, a minute's descent
    did not reach every bucket)."""
    moved = sorted(
        (r for r in results if r.moved), key=lambda r: abs(math.log2(size(r.bucket) / at))
    )
    return tuple(r.best for r in moved[:most])


def tune_bucket(
    bench, prior: dict, spec, bucket, sm_count, deadline: float, axes=AXES, values=candidates,
    seeds: tuple = (), build=None, restarts: tuple = (),
) -> Tuned:  # fmt: skip
    """Coordinate descent from the prior: each knob (or knobs moved together: `knobs_at`) in
    turn over its values (`values`, the current one first: `candidates`), the others at the
    point so far, pass after pass until one moves nothing (a knob's best can change with
    another's: the prefill's 128-row blocks lose at 32-key tiles and win at 128). A candidate
    must match the reference (within the prior's own error, at least float16's 1e-2) and beat
    the point by MARGIN. `seeds` (launches found at other buckets) are tried first, so the
    descent starts from the best of them; `restarts` (another prior's launch) start a descent
    of their own once the first has ended; then, from the fastest launch so far, every pair of
    axes moves together (a launch no single knob reaches), a pair's win followed by single
    knobs again, until neither moves. The fastest launch of all is kept; none is checked or
    timed twice. Stops at `deadline` (time.monotonic). `bench`: `error(launch)` and
    `time_ms(launch)` (StepBench). `build` (launch -> None, its kernels compiled), where given,
    runs on a move's candidates side by side (BUILD_THREADS at a time) before they are checked
    and timed one by one (`build_all`)."""
    tolerance = max(1e-2, 2 * bench.error(prior))
    prior_ms = bench.time_ms(prior)
    result = Tuned(bucket, dict(prior), dict(prior), prior_ms, prior_ms)
    times = [(dict(prior), prior_ms)]  # launch -> ms, None where rejected (launches hold
    # tuples and dicts: compared, not hashed)

    def known(launch: dict):
        return next((ms for seen, ms in times if seen == launch), False)

    def measure(launch: dict):
        """The launch's time, None where its check rejects it; the best kept."""
        ms = known(launch)
        if ms is not False:
            return ms
        result.tried += 1
        try:
            err = bench.error(launch)
        except Exception as e:  # a launch this GPU or this shape refuses is no candidate
            err = f"{type(e).__name__}: {e}"
        ms = None
        if isinstance(err, float) and err <= tolerance:  # (a NaN fails too)
            ms = bench.time_ms(launch)
            if ms < result.best_ms * (1 - MARGIN):
                result.best, result.best_ms = launch, ms
        else:
            result.rejected.append((launch, err))
        times.append((launch, ms))
        return ms

    def each(launches: list):
        """The launches to try before the deadline, those new built side by side first, as
        many at a time as there are build threads (a pair's dozens of launches are not all
        compiled past the deadline)."""
        launches = [dict(launch) for launch in launches]
        for i in range(0, len(launches), BUILD_THREADS):
            chunk = launches[i : i + BUILD_THREADS]
            if build is not None and time.monotonic() <= deadline:
                build_all(build, [launch for launch in chunk if known(launch) is False])
            for launch in chunk:
                if time.monotonic() > deadline:
                    return
                yield launch

    def one(axis, point: dict) -> list:
        """The launches that move `axis` alone from `point` (a win within the axis changes no
        other knob, so they are known before the first is timed)."""
        others = values(axis, point, spec, bucket, sm_count)[1:]
        return [{**point, **knobs_at(axis, value)} for value in others]

    def two(axis, other, point: dict) -> list:
        """The launches that move both axes from `point` (the second's values those that fit
        beside the first's)."""
        return [launch for moved in one(axis, point) for launch in one(other, moved)]

    singles = [functools.partial(one, axis) for axis in axes]
    pairs = [functools.partial(two, *both) for both in itertools.combinations(axes, 2)]

    def climb(point: dict, point_ms: float, moves: list) -> tuple:
        """(point, ms): to the faster launch of each move's in turn, pass after pass until a
        pass moves nothing."""
        moved = True
        while moved and time.monotonic() <= deadline:
            start = point
            for move in moves:
                for launch in each(move(point)):
                    ms = measure(launch)
                    if ms is not None and ms < point_ms * (1 - MARGIN):
                        point, point_ms = launch, ms
            moved = point != start
        return point, point_ms

    for seed in each([s for s in seeds if s != prior]):
        measure(seed)
    climb(result.best, result.best_ms, singles)
    for start in each([r for r in restarts if known(r) is False]):
        ms = measure(start)
        if ms is not None:
            climb(start, ms, singles)
    # then from the best of them two knobs at once (the neutral prefill's 128-row blocks win
    # only at 64-key tiles, from 128-key tiles no single knob reaches them), each pair's win
    # followed by the single knobs again
    point, point_ms = result.best, result.best_ms
    while time.monotonic() <= deadline:
        start = point
        point, point_ms = climb(*climb(point, point_ms, pairs), singles)
        if point == start:
            break
    if result.best == prior:
        return result
    # the winner timed again beside the prior: a margin won by noise does not stand
    again, prior_again = bench.time_ms(result.best), bench.time_ms(prior)
    if again > prior_again * (1 - MARGIN):
        result.best, result.best_ms, result.prior_ms = dict(prior), prior_again, prior_again
    else:
        result.best_ms, result.prior_ms = again, prior_again
    return result


def build_all(build, launches: list, threads: int = BUILD_THREADS) -> None:
    """`build` run on each launch in threads: Triton compiles with the GIL released, so the
    launches' kernels compile side by side, and the checks that follow, one at a time, find
    them built. What a build does or raises decides nothing: a launch is right or refused only
    by its own check."""

    # a thread starts on CUDA's first device: each takes the caller's, as its launches would
    device = torch.cuda.current_device() if torch.cuda.is_initialized() else None

    def one(launch: dict) -> None:
        try:
            if device is not None:
                torch.cuda.set_device(device)
            build(launch)
        except Exception:  # (its check raises it again, and rejects the launch)
            pass

    if len(launches) > 1:
        with ThreadPoolExecutor(min(threads, len(launches))) as pool:
            list(pool.map(one, launches))


def layout_of(variant) -> tuple:
    """(layout, pdl) of an assembly: what its decode attention's launch depends on."""
    layout = "slab" if variant.cache == "slab" else f"paged{variant.block_size}"
    return layout, variant.layers == "fused-pdl"


def device_key(spec: ModelSpec, device) -> dict:
    """What any kernel search's table is valid for: the GPU, the versions, the model's shape."""
    import triton

    props = torch.cuda.get_device_properties(device)
    return {
        "gpu": props.name,
        "capability": list(torch.cuda.get_device_capability(device)),
        "sms": props.multi_processor_count,
        "triton": triton.__version__,
        "torch": torch.__version__.split("+")[0],
        "host": platform.machine(),
        "shape": [spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim],
        "hidden": [spec.hidden_size, spec.intermediate_size, spec.vocab_size],
        "max_positions": spec.max_positions,
        "dtype": str(spec.config_dtype).removeprefix("torch."),
    }


def machine_key(spec: ModelSpec, variant, prior: str, device) -> dict:
    """What a table is valid for: the GPU, the versions, the model's shape, the layout."""
    layout, pdl = layout_of(variant)
    key = device_key(spec, device)
    return {**key, "layout": layout, "pdl": pdl, "graphs": variant.graphs, "prior": prior}


def cache_path(folder, key: dict, name: str = "decode_attention") -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(folder) / f"{name}-{digest}.json"


def read_cache(path: Path, key: dict) -> dict | None:
    """The cached search at `path` if it was made for `key`, else None."""
    if path.is_file():
        data = json.loads(path.read_text())
        if data.get("key") == key:
            return data
    return None


def write_cache(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(path)


def cached_search(folder, key: dict, name: str, search, to_json, from_json) -> tuple:
    """(table, results, path): the table cached in `folder` for `key` (a search's `name`), or
    `search()`'s, (table, its per-bucket results as plain data), cached there with the time
    it took. `to_json` and `from_json`: the table as the file holds it."""
    path = cache_path(folder, key, name)
    data = read_cache(path, key)
    if data is not None:
        return from_json(data["table"]), data.get("results", []), path
    started = time.monotonic()
    table, results = search()
    payload = {"key": key, "seconds": round(time.monotonic() - started, 1),
               "table": to_json(table), "results": results}  # fmt: skip
    write_cache(path, payload)
    return table, results, path


def table_to_json(table: dict) -> dict:
    return {f"{b}x{c}": {k: list(v) if isinstance(v, tuple) else v for k, v in launch.items()}
            for (b, c), launch in table.items()}  # fmt: skip


def table_from_json(data: dict) -> dict:
    table = {}
    for key, launch in data.items():
        b, c = (int(x) for x in key.split("x"))
        table[b, c] = {k: tuple(v) if isinstance(v, list) else v for k, v in launch.items()}
    return table


def transplant(other: dict, own: dict) -> dict:
    """Another model's table on this model's buckets (`own`: this model's table or prior):
    each bucket takes the other's launch at the same key, else at the same rows' nearest
    context (else the nearest key), except the head's cut (`parts`), which is bound to the
    head size and stays this model's. Crossing two models' tables (experiments/cross_knobs.py)."""
    out = {}
    for (rows, context), launch in own.items():
        near = [k for k in other if k[0] == rows] or list(other)
        key = min(near, key=lambda k: (abs(k[1] - context), abs(k[0] - rows)))
        out[rows, context] = {**other[key], "parts": launch["parts"]}
    return out


def prior_table(config: dict, variant, prior: str, device) -> dict:
    """The launch of every decode graph bucket as the rules (or the neutral defaults) pick it;
    the neutral prior's buckets at the traces' contexts (`trace_contexts`)."""
    spec, device = ModelSpec.from_config(config), torch.device(device)
    sm_count = device_sm_count(device)
    rules = device_capability(device) if prior == "hand" else NEUTRAL
    contexts = trace_contexts(config, spec.max_positions) if prior != "hand" else None
    policy = variant.graphs if variant.graphs != "off" else "pow2"
    buckets = graph_buckets(spec, rules, policy, contexts=contexts)
    return {k: prior_launch(spec, *k, sm_count, rules) for k in buckets}


def tune(
    config: dict,
    weight_dir: str,
    variant,
    prior: str = "hand",
    budget_s: float = 120.0,
    device="cuda",
    log=print,
) -> tuple:
    """(table, results): the launch of every decode graph bucket of `variant`'s engine (the
    prior's where the traces never go or the budget ran out) and what the search did per
    bucket, most steps first."""
    spec = ModelSpec.from_config(config)
    device = torch.device(device)
    sm_count = device_sm_count(device)
    table = prior_table(config, variant, prior, device)
    buckets = trace_buckets(config, list(table))
    if not buckets or budget_s <= 0:
        return table, []
    engine = build_engine(config, weight_dir, str(device), variant, knobs=dict(table))
    deadline = time.monotonic() + budget_s  # (the engine's build is not the search's)
    layout, pdl = layout_of(variant)
    results = []
    for i, bucket in enumerate(buckets):
        if time.monotonic() > deadline:
            break
        key = (bucket.rows, bucket.context)
        check = KernelCheck(spec, bucket, layout, pdl, device, spec.config_dtype)
        bench = StepBench(engine, bucket, check, spec.vocab_size)
        axes = PDL_AXES if pdl else AXES
        until = share_deadline(time.monotonic(), deadline, buckets[i:])
        near = nearest_found(results, lambda b: b.rows * b.context, bucket.rows * bucket.context)
        # from the rules, a second descent from the neutral launch (another start, another
        # optimum: `restarts`)
        again = (prior_launch(spec, *key, sm_count, NEUTRAL),) if prior == "hand" else ()
        found = tune_bucket(
            bench, table[key], spec, bucket, sm_count, until, axes, seeds=near, build=bench.build,
            restarts=again,
        )  # fmt: skip
        engine.remove(bench.ids)
        engine.model.attention.knobs[key] = table[key] = found.best
        results.append(found)
        log(
            f"  {bucket.rows:3d} rows x {bucket.context:5d} (weight {bucket.weight:.2f}, longest "
            f"{max(bucket.lengths)}): a step {found.outcome()}"
        )
    del engine
    return table, results


def summary(results: list) -> list:
    """The per-bucket results as plain data (results.log, the cache file)."""
    plain = lambda v: list(v) if isinstance(v, tuple) else v  # noqa: E731
    return [
        {"rows": r.bucket.rows, "context": r.bucket.context, "steps": r.bucket.steps,
         "weight": round(r.bucket.weight, 2),
         "longest": max(r.bucket.lengths), "prior_us": round(r.prior_ms * 1e3, 1),
         "best_us": round(r.best_ms * 1e3, 1), "tried": r.tried,
         "rejected": len(r.rejected), "moved": {k: plain(v) for k, v in r.moved.items()}}
        for r in results
    ]  # fmt: skip


def searched(tune_, summary_, *args, **kwargs) -> tuple:
    """(table, results as plain data) of a search: `tune_(*args, **kwargs)`, its results
    through `summary_`."""
    table, results = tune_(*args, **kwargs)
    return table, summary_(results)


def load_or_tune(config, weight_dir, variant, folder, prior="hand", budget_s=120.0,
                 device="cuda", log=print):  # fmt: skip
    """(table, results, path): the cached table for this machine, model shape and layout, or
    a new search, cached in `folder`."""
    key = machine_key(ModelSpec.from_config(config), variant, prior, torch.device(device))
    search = functools.partial(searched, tune, summary, config, weight_dir, variant, prior,
                               budget_s, device, log=log)  # fmt: skip
    return cached_search(folder, key, "decode_attention", search, table_to_json, table_from_json)


def kernel_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments every kernel search's command takes: the target, the assembly, the budget,
    the cache and the output."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--config", default="target/model_config.json")
    parser.add_argument("--weight-dir", default="target/weights")
    parser.add_argument("--preset", default="slab-triton-pdl-allgraphs", choices=sorted(PRESETS))
    parser.add_argument("--variant", help="a Variant as JSON (instead of --preset)")
    parser.add_argument("--budget", type=float, default=120.0, help="seconds of search")
    parser.add_argument("--cache-dir", help="reuse (or keep) the table for this machine here")
    parser.add_argument("--json", help="write the table and the per-bucket results here")
    parser.add_argument(
        "--prior",
        choices=("hand", "neutral"),
        default="hand",
        help="start from the H200's rules, or from a GPU nothing was measured on",
    )
    return parser


def kernel_target(args) -> tuple:
    """(config, variant) of a kernel search's command line."""
    config = json.loads(Path(args.config).read_text())
    variant = Variant.from_dict(json.loads(args.variant)) if args.variant else PRESETS[args.preset]
    return config, variant


def search_command(args, load, search, to_json, what: str) -> int:
    """A kernel search's command: with --cache-dir the table `load(folder)` finds or makes there
    (its path printed: the run's phase reads it), else `search()`'s; the table and the
    per-bucket results to --json. `what`: what a result is, for the log."""
    started = time.monotonic()
    if args.cache_dir:
        table, results, path = load(args.cache_dir)
        print(f"table {path}")
    else:
        table, results = search()
    print(f"{len(results)} {what} searched in {time.monotonic() - started:.0f} s")
    if args.json:
        payload = {"table": to_json(table), "results": results}
        Path(args.json).write_text(json.dumps(payload, indent=1))
    return 0


def main(argv=None) -> int:
    parser = kernel_parser(__doc__)
    args = parser.parse_args(argv)
    config, variant = kernel_target(args)
    target = (config, args.weight_dir, variant)
    load = lambda folder: load_or_tune(*target, folder, args.prior, args.budget)  # noqa: E731
    search = functools.partial(searched, tune, summary, *target, args.prior, args.budget)
    return search_command(args, load, search, table_to_json, "buckets")


if __name__ == "__main__":
    raise SystemExit(main())
