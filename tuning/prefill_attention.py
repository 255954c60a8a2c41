"""The prefill attention's tiles searched at the target's shapes on this GPU.

A prefill graph launches the varlen attention kernel (kernels/prefill_attention.py) with one tile
for its token bucket: (BLOCK_M, BLOCK_N, warps) by `prefill_tiles`, stages by `prefill_stages`,
rules measured on one GPU at one head size. Here each bucket the traces' prefill calls reach is
searched as the decode attention's launch is (decode_attention.py: coordinate descent from the
rules, the same margin and deadline shares); every candidate must match a float32 reference on
the bucket's packed prompts before it is timed. A candidate is timed as its bucket's graph runs
it, alone: one launch a layer at the bucket's fixed grid, in a CUDA graph replayed back to back
(no other kernel of a prefill depends on its tiles).

The result, tokens -> tiles where they beat the rules, is cached per GPU, model shape and Triton
version (`cache_path`), bound to our attention as `prefill_knobs` and written into engine.py as
constants; the prefill graphs build a bucket's q-block schedule for its BLOCK_M.

    python -m tuning.prefill_attention [--config target/model_config.json]
        [--preset NAME | --variant JSON] [--budget 120] [--prior hand|neutral]
        [--cache-dir studies/kernels] [--json table.json]
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from evaluator.benchmark_traces import SUITES
from evaluator.traces import Prefill
from tuning.decode_attention import (
    NEUTRAL,
    cached_search,
    device_key,
    kernel_parser,
    kernel_target,
    knobs_at,
    nearest_found,
    replay_ms,
    search_command,
    searched,
    share_deadline,
    tune_bucket,
)
from variants.execution.cuda_graphs import doubling_buckets
from variants.execution.prefill_graphs import LARGEST_TOKENS, MOST_PROMPTS, SMALLEST_TOKENS
from variants.kernels.device import device_capability, device_sm_count
from variants.kernels.prefill_attention import (
    head_parts,
    prefill_schedule,
    prefill_stages,
    prefill_tiles,
    varlen_prefill_attention,
)
from variants.spec import ModelSpec

# The knobs (the launcher's `tiles`) and the values they take. A q-block's rows and its warps
# move together: its output tile lives in its warps' registers, so a taller block wants more
# warps (128 rows spill at 4 warps, and one knob at a time would never try them at 8).
KNOBS = ("block_m", "block_n", "warps", "stages")
PROGRAM = ("block_m", "warps")
AXES = (PROGRAM, "block_n", "stages")  # in the order they are searched
VALUES = {
    "block_m": (16, 32, 64, 128),
    "block_n": (32, 64, 128),
    "warps": (2, 4, 8),
    "stages": (2, 3, 4),
}
# The most float32 output values a thread holds (BLOCK_M x the padded head over the warps'
# threads): past that a tile spills. The rules' tiles hold at most 96 (64 x 192 over 4 warps).
MOST_ACCUMULATOR = 128


@dataclass(frozen=True)
class PrefillBucket:
    """A prefill graph's token bucket, the prompt lengths it is timed at (its median call by
    tokens), how many of the traces' calls fall in it and its weight: the sum over the traces of
    the share of each one's prefill tokens it holds (a call's time grows with its tokens; every
    trace counts alike, as in the traces' geometric mean)."""

    tokens: int
    lengths: tuple
    calls: int = 0
    weight: float = 0.0


def graph_buckets() -> list:
    """The token buckets the prefill graphs capture."""
    return doubling_buckets(SMALLEST_TOKENS, LARGEST_TOKENS)


def prefill_buckets(config: dict, buckets: list, most_prompts: int = MOST_PROMPTS) -> list:
    """The buckets the timed traces' prefill calls fall in (those a graph runs: within the
    largest bucket and `most_prompts`), the heaviest first (`PrefillBucket`)."""
    calls, weight = defaultdict(list), defaultdict(float)
    for suite in SUITES.values():
        for trace in suite(config):
            total = trace.prefill_tokens
            for op in trace.ops:
                n = sum(op.lengths) if isinstance(op, Prefill) else 0
                if 0 < n <= buckets[-1] and len(op.lengths) <= most_prompts:
                    t = next(b for b in buckets if b >= n)
                    calls[t].append(op.lengths)
                    weight[t] += n / total
    found = []
    for t, seen in calls.items():
        seen.sort(key=sum)
        found.append(PrefillBucket(t, seen[len(seen) // 2], len(seen), weight[t]))
    return sorted(found, key=lambda b: (-b.weight, -b.calls))


def prior_launch(spec: ModelSpec, tokens: int, capability) -> dict:
    """The tiles the launcher picks for a call of `tokens` packed tokens, as knobs (the rules;
    at capability NEUTRAL, those of a GPU nothing was measured on)."""
    tiles = (*prefill_tiles(spec.head_dim, capability, tokens), prefill_stages(capability))
    return dict(zip(KNOBS, tiles))


def launch_of(knobs: dict) -> dict:
    """The search's knobs as the launcher and the attention's table take them: `tiles`."""
    return {"tiles": tuple(knobs[k] for k in KNOBS)}


def fits(knobs: dict, spec: ModelSpec, shared_bytes: int) -> bool:
    """Whether a tile is worth compiling: the key and value tiles its pipeline keeps in flight
    (stages - 1 of each, the head padded to its parts) within the device's shared memory, and
    its output tile within MOST_ACCUMULATOR values a thread."""
    width = sum(head_parts(spec.head_dim))
    staged = (knobs["stages"] - 1) * 2 * knobs["block_n"] * width * spec.config_dtype.itemsize
    held = knobs["block_m"] * width / (32 * knobs["warps"])
    return staged <= shared_bytes and held <= MOST_ACCUMULATOR


def candidates(shared_bytes: int, axis, current: dict, spec: ModelSpec, bucket, sm_count):
    """The values an axis takes (PROGRAM: every (BLOCK_M, warps) pair), the current one first:
    q-blocks no taller than the bucket's longest prompt needs (a q-block holds one prompt's
    rows), tiles that `fits`."""
    tallest = max(16, 1 << (max(bucket.lengths) - 1).bit_length())
    if axis == PROGRAM:
        first = tuple(current[k] for k in PROGRAM)
        rows = [m for m in VALUES["block_m"] if m <= tallest]
        values = list(itertools.product(rows, VALUES["warps"]))
    else:
        first, values = current[axis], list(VALUES[axis])
    fit = lambda v: fits({**current, **knobs_at(axis, v)}, spec, shared_bytes)  # noqa: E731
    return [first] + [v for v in values if v != first and fit(v)]


class PrefillCheck:
    """A bucket's call for the kernel alone, as its prefill graph launches it on the Triton
    stack: the prompts packed into the bucket's tokens (the rows after them belong to no
    prompt), q and k apart, v a view of the projection's output, the grid fixed, reading a
    schedule built for the launch's BLOCK_M; checked against float32 attention per prompt.
    `run(knobs)` launches it; `error(knobs)`: its largest error over the prompts' rows, v (and
    so the output) negated every other call: rows a launch leaves unwritten, holding an earlier
    call's output where the allocator hands its memory back, never pass. `build(knobs)` runs
    it on zeroed values (the output zero, so a build leaves no output that could pass)."""

    def __init__(self, spec: ModelSpec, bucket: PrefillBucket, device, dtype,
                 most_prompts: int = MOST_PROMPTS):  # fmt: skip
        gen = torch.Generator().manual_seed(bucket.tokens)
        t, heads, kv_heads, d = bucket.tokens, spec.num_heads, spec.num_kv_heads, spec.head_dim
        rand = lambda *shape: torch.randn(*shape, generator=gen).to(device, dtype)  # noqa: E731
        self.q, self.k = rand(t, heads, d), rand(t, kv_heads, d)
        projected = rand(t, (heads + 2 * kv_heads) * d)
        self.v, negated, self.zeros = (
            x[:, -kv_heads * d :].view(t, kv_heads, d)
            for x in (projected, -projected, torch.zeros_like(projected))
        )
        self.values = itertools.cycle(((self.v, 1.0), (negated, -1.0)))
        self.lengths, self.device = list(bucket.lengths), device
        self.starts = [0, *itertools.accumulate(self.lengths)]
        self.cu = torch.tensor(self.starts, dtype=torch.int32, device=device)
        self.tokens, self.most_prompts = t, most_prompts
        self.scale = 1.0 / math.sqrt(d)
        self.schedules: dict = {}  # BLOCK_M -> its schedule on the device (a graph reads it)
        self.want = self._reference()

    def _reference(self) -> torch.Tensor:
        """Causal attention per prompt in float32, K and V repeated over their query heads."""
        group = self.q.shape[1] // self.k.shape[1]
        outs = []
        for start, n in zip(self.starts, self.lengths):
            rows = slice(start, start + n)
            q, k, v = (x[rows].float().transpose(0, 1) for x in (self.q, self.k, self.v))
            k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
            outs.append(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1))
        return torch.cat(outs)

    def schedule(self, block_m: int) -> torch.Tensor:
        """The bucket's q-block table for BLOCK_M, as wide as its prefill graph's."""
        if block_m not in self.schedules:
            blocks = -(-self.tokens // block_m) + self.most_prompts
            table = prefill_schedule(self.lengths, block_m, blocks)
            self.schedules[block_m] = torch.tensor(table, device=self.device).view(2, blocks)
        return self.schedules[block_m]

    def run(self, knobs: dict, v: torch.Tensor | None = None) -> torch.Tensor:
        schedule = self.schedule(knobs["block_m"])
        return varlen_prefill_attention(
            self.q, self.k, self.v if v is None else v, self.cu, max(self.lengths), self.scale,
            schedule, **launch_of(knobs),
        )  # fmt: skip

    def build(self, knobs: dict) -> None:
        self.run(knobs, self.zeros)

    def error(self, knobs: dict) -> float:
        v, sign = next(self.values)
        out = self.run(knobs, v)[: self.starts[-1]]
        return float((out.float() - sign * self.want).abs().max())


class GraphBench:
    """A launch timed as a bucket's prefill graph runs it: the check's call once a layer,
    captured in one CUDA graph and replayed back to back; its correctness from the check."""

    def __init__(self, check: PrefillCheck, layers: int):
        self.check, self.layers = check, layers

    def error(self, knobs: dict) -> float:
        return self.check.error(knobs)

    def build(self, knobs: dict) -> None:
        self.check.build(knobs)

    def time_ms(self, knobs: dict, replays: int = 20, rounds: int = 3) -> float:
        """The median GPU time of a prefill's attention (every layer's) with `knobs`."""
        self.check.run(knobs)  # compiled, its schedule made, before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(self.layers):
                self.check.run(knobs)
        return replay_ms(graph, replays, rounds)


def shared_memory(device: torch.device) -> int:
    """The shared memory one program may take on the GPU (bytes)."""
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin


def prior_table(spec: ModelSpec, prior: str) -> dict:
    """tokens -> the tiles of every prefill graph bucket as `prior` starts them: empty for the
    hand rules (the launcher's own), the rules at capability NEUTRAL else."""
    if prior == "hand":
        return {}
    return {t: launch_of(prior_launch(spec, t, NEUTRAL)) for t in graph_buckets()}


def tune(config: dict, budget_s: float = 120.0, device="cuda", log=print, bench=GraphBench,
         check=PrefillCheck, prior: str = "hand") -> tuple:  # fmt: skip
    """(table, results): tokens -> the tiles found where they beat the rules' (with the neutral
    `prior`: every bucket's, the neutral tiles where nothing beat them), and what the search did
    per bucket, the heaviest first. `bench` and `check` make a bucket's GraphBench and
    PrefillCheck (the tests' fakes elsewhere)."""
    spec = ModelSpec.from_config(config)
    device = torch.device(device)
    capability, sm_count = device_capability(device), device_sm_count(device)
    if prior != "hand":
        capability = NEUTRAL
    buckets = prefill_buckets(config, graph_buckets())
    table = prior_table(spec, prior)
    if not buckets or budget_s <= 0:
        return table, []
    values = functools.partial(candidates, shared_memory(device))
    deadline = time.monotonic() + budget_s
    results = []
    for i, bucket in enumerate(buckets):
        if time.monotonic() > deadline:
            break
        start = prior_launch(spec, bucket.tokens, capability)
        timed = bench(check(spec, bucket, device, spec.config_dtype), spec.num_layers)
        until = share_deadline(time.monotonic(), deadline, buckets[i:])
        near = nearest_found(results, lambda b: b.tokens, bucket.tokens)
        again = (prior_launch(spec, bucket.tokens, NEUTRAL),) if prior == "hand" else ()
        found = tune_bucket(
            timed, start, spec, bucket, sm_count, until, AXES, values, near, timed.build, again
        )
        if found.best != start or prior != "hand":
            table[bucket.tokens] = launch_of(found.best)
        results.append(found)
        log(
            f"  {bucket.tokens:5d} tokens (weight {bucket.weight:.2f}, {len(bucket.lengths)} "
            f"prompts, longest {max(bucket.lengths)}): the attention {found.outcome()}"
        )
    return table, results


def summary(results: list) -> list:
    """The per-bucket results as plain data (the cache file, the CLI's json)."""
    return [
        {"tokens": r.bucket.tokens, "calls": r.bucket.calls, "weight": round(r.bucket.weight, 2),
         "prompts": len(r.bucket.lengths), "longest": max(r.bucket.lengths),
         "prior_us": round(r.prior_ms * 1e3, 1), "best_us": round(r.best_ms * 1e3, 1),
         "tried": r.tried, "rejected": len(r.rejected), "moved": r.moved}
        for r in results
    ]  # fmt: skip


def table_to_json(table: dict) -> dict:
    return {str(tokens): {"tiles": list(launch["tiles"])} for tokens, launch in table.items()}


def table_from_json(data: dict) -> dict:
    return {int(tokens): {"tiles": tuple(launch["tiles"])} for tokens, launch in data.items()}


def load_or_tune(config: dict, folder, budget_s: float = 120.0, device="cuda", log=print,
                 prior: str = "hand"):  # fmt: skip
    """(table, results, path): the cached table for this machine, model shape and prior, or a
    new search, cached in `folder`."""
    spec = ModelSpec.from_config(config)
    key = {**device_key(spec, torch.device(device)), "kernels": "prefill_attention"}
    key["prior"] = prior
    search = functools.partial(searched, tune, summary, config, budget_s, device, log=log,
                               prior=prior)  # fmt: skip
    return cached_search(folder, key, "prefill_attention", search, table_to_json, table_from_json)


def main(argv=None) -> int:
    parser = kernel_parser(__doc__)
    args = parser.parse_args(argv)
    config, variant = kernel_target(args)
    if variant.attention != "triton" or variant.prefill_graphs == "off":
        # the buckets timed are those our attention's prefill graphs capture
        parser.error(
            "the search times the prefill graphs' attention: the variant needs our attention "
            "and prefill graphs"
        )
    if not torch.cuda.is_available():
        parser.error("the search times kernels on a GPU: no CUDA device here")
    load = lambda folder: load_or_tune(config, folder, args.budget, prior=args.prior)  # noqa: E731
    search = functools.partial(searched, tune, summary, config, args.budget, prior=args.prior)
    return search_command(args, load, search, table_to_json, "token buckets")


if __name__ == "__main__":
    raise SystemExit(main())
