"""The few-row projection kernels' launches searched at the target's shapes on this GPU.

A decode step of the fused layers is mostly its few-row kernels: norm + QKV + RoPE ("qkv"), the
output projection ("o"), norm + gate-up + SiLU ("swiglu"), the down projection ("down") and the
head ("head"). Their tiles and splits come from rules measured on one GPU (few_row_tiles,
swiglu_tiles, default_split_k). Here each kernel at each decode row bucket the traces reach is
searched as the decode attention's launch is (decode_attention.py: the same buckets and weights,
the same step bench, coordinate descent and margin), from the rules' launch; every candidate
must match a float32 reference before it is timed.

The head may also run on cuBLAS after our norm kernel, the library its first knob. Where the
GPU and Triton can (Hopper, kernels/pdl.py), each kernel's programmatic dependent launch is a
knob of its own: the fused-pdl layers launch every kernel so, which holds SMs the wide
projections need while they run (docs/PERF.md), the fused layers none.
The result, (kernel, rows) -> tiles, split_k and pdl where they beat the rules, is cached per GPU,
model shape, layout and Triton version (`cache_path`), bound to the fused stack and head as
`knobs` and written into engine.py as constants.

    python -m tuning.few_row [--config target/model_config.json] [--weight-dir target/weights]
        [--preset NAME | --variant JSON] [--budget 120] [--prior hand|neutral]
        [--cache-dir studies/kernels] [--json table.json]
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace

import torch
import torch.nn.functional as F

from tuning.decode_attention import (
    StepBench,
    cached_search,
    graph_buckets,
    kernel_parser,
    kernel_target,
    machine_key,
    nearest_found,
    search_command,
    searched,
    share_deadline,
    trace_buckets,
    tune_bucket,
)
from variants.build import build_engine
from variants.kernels.device import device_capability, device_sm_count
from variants.kernels.few_row_linear import few_row_linear
from variants.kernels.fused_norm import add_rms_norm
from variants.kernels.norm_qkv_rope import norm_qkv_rope
from variants.kernels.norm_swiglu import norm_swiglu, swiglu_tiles
from variants.kernels.pdl import pdl_supported
from variants.kernels.row_dot import few_row_tiles
from variants.kernels.split_k import LONG_K, LONG_K_TILES, host_cdiv, splits_for
from variants.kernels.staged_dot import default_stage, short_staged_tiles
from variants.layers.fused_stack import FUSED_MAX_ROWS, HEAD_MAX_ROWS, PDL_MAX_ROWS
from variants.layers.rmsnorm import rms_norm
from variants.layers.rope import RopeTable, apply_rope
from variants.spec import ModelSpec

LAYER_KERNELS = ("qkv", "o", "swiglu", "down")  # a layer's, in the order a step runs them
# (BLOCK_N, BLOCK_K, warps, stages) of every kernel on a GPU nothing was measured on (the
# neutral prior: no rule made for one GPU), unsplit
NEUTRAL_TILES = (32, 64, 4, 2)
LINEAR = ("o", "down", "head")  # few_row_linear's
TILE_AXES = ("block_n", "block_k", "warps", "stages")  # a launch's `tiles`, in launch_of's order
# The knobs in the order they are searched: the head's library (cuBLAS after the norm, or ours:
# its weight is the model's largest, and no rule says which reads it faster), then whether the
# kernel launches with PDL (it changes which split and tiles win), then the split, then the
# tiles. The split sets how many programs share the SMs and whether the partials' round trip
# ends the kernel, and it moved the most where it was timed (the 1B model's QKV: docs/PERF.md);
# searched last, a short budget never reached it.
AXES = ("library", "pdl", "split_k", *TILE_AXES)
# In the cache key: a table an older search cached is searched again (2: the bench times the
# launch in the engine's own table; 3: the head's library is searched; 4: each kernel's PDL).
SEARCH_VERSION = 4
VALUES = {
    "library": ("triton", "cublas"),
    "pdl": (False, True),
    "block_n": (16, 32, 64, 128),
    "block_k": (32, 64, 128, 256),
    "warps": (2, 4, 8),
    "stages": (2, 3, 4, 6),
    "split_k": (1, 2, 4, 8, 16),
}


def kernels_at(rows: int, pdl: bool) -> tuple:
    """The few-row kernels a decode step of `rows` rows runs (fused_stack's row limits)."""
    layers = LAYER_KERNELS if rows <= (PDL_MAX_ROWS if pdl else FUSED_MAX_ROWS) else ()
    return layers + (("head",) if rows <= HEAD_MAX_ROWS else ())


def kernel_shape(kernel: str, spec: ModelSpec) -> tuple:
    """(output columns, reduction length, weight tiles a program reads) as the launcher counts
    them: qkv's columns are rotation pairs, swiglu's the intermediate (gate and up rows)."""
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    return {
        "qkv": ((q + 2 * kv) // 2, spec.hidden_size, 2),
        "o": (spec.hidden_size, q, 1),
        "swiglu": (spec.intermediate_size, spec.hidden_size, 2),
        "down": (spec.hidden_size, spec.intermediate_size, 1),
        "head": (spec.vocab_size, spec.hidden_size, 1),
    }[kernel]


def prior_launch(kernel: str, rows: int, spec: ModelSpec, sm_count: int, pdl: bool,
                 prior: str = "hand") -> dict:  # fmt: skip
    """The launch the fused stack's call of `kernel` makes at `rows` rows without a table, every
    knob explicit (the launchers' own choice, step by step; PDL as the layers' `pdl`); `prior`
    "neutral": NEUTRAL_TILES, fitted to shared memory as the rules' are, and no split."""
    n, k, weight_tiles = kernel_shape(kernel, spec)
    if prior == "neutral":
        _, *tiles = few_row_tiles(rows, n, sm_count, weight_tiles, NEUTRAL_TILES)
        return dict(zip(TILE_AXES, tiles), split_k=1, library="triton", pdl=pdl)
    long_k = kernel in LINEAR and k >= LONG_K
    prefer = swiglu_tiles(rows) if kernel == "swiglu" else LONG_K_TILES if long_k else None
    block_m, *tiles = few_row_tiles(rows, n, sm_count, weight_tiles, prefer)
    if kernel in LINEAR and not long_k and default_stage(pdl, rows):
        tiles = short_staged_tiles(block_m, k, spec.config_dtype.itemsize) or tiles
    programs = host_cdiv(n, tiles[0]) * host_cdiv(rows, block_m)
    split_k = splits_for(None, programs, k, tiles[1], sm_count)
    return dict(zip(TILE_AXES, tiles), split_k=split_k, library="triton", pdl=pdl)


def launch_of(knobs: dict) -> dict:
    """The search's knobs as the launchers take them: `tiles`, `split_k` and `pdl`, or `cublas`
    (the head only: the norm, with `pdl`, then cuBLAS's projection; no launch of ours)."""
    if knobs.get("library") == "cublas":
        return {"cublas": True, "pdl": knobs["pdl"]}
    return {
        "tiles": tuple(knobs[a] for a in TILE_AXES), "split_k": knobs["split_k"],
        "pdl": knobs["pdl"],
    }  # fmt: skip


def candidates(kernel: str, axis: str, current: dict, spec: ModelSpec, bucket, sm_count,
               has_pdl: bool = False) -> list:  # fmt: skip
    """The values one knob of `kernel` takes, the current one first: tiles no wider than the
    columns or the reduction need, at most one split a BLOCK_K chunk; a library for the head
    alone, PDL where the GPU and Triton have it (`has_pdl`), and no knob of ours moved on
    cuBLAS."""
    if axis == "library" and kernel != "head" or current.get("library") == "cublas":
        return [current[axis]]
    if axis == "pdl":
        return [current[axis]] + ([not current[axis]] if has_pdl else [])
    n, k, _ = kernel_shape(kernel, spec)
    most = {
        "block_n": max(16, 1 << (n - 1).bit_length()),
        "block_k": max(32, 1 << (k - 1).bit_length()),
        "split_k": host_cdiv(k, current["block_k"]),
    }.get(axis)
    values = [v for v in VALUES[axis] if most is None or v <= most]
    first = current[axis]
    return [first] + [v for v in values if v != first]


class FewRowCheck:
    """One kernel's inputs at `rows` rows (the fused stack's call of it), checked against a
    float32 reference. `error(launch)`: the launch's largest error (`launch_of`'s form)."""

    def __init__(self, kernel: str, spec: ModelSpec, rows: int, device, dtype, pdl: bool,
                 sm_count: int):  # fmt: skip
        self.kernel, self.spec, self.pdl, self.sm_count = kernel, spec, pdl, sm_count
        gen = torch.Generator().manual_seed(rows)
        n, k, _ = kernel_shape(kernel, spec)
        rand = lambda *shape, scale=1.0: (  # noqa: E731
            (scale * torch.randn(*shape, generator=gen)).to(device, dtype)
        )
        self.x = rand(rows, k)
        columns = {"qkv": 2 * n, "swiglu": 2 * n}.get(kernel, n)
        self.weight = rand(columns, k, scale=k**-0.5)
        self.norm = (1 + 0.1 * torch.randn(k, generator=gen)).to(device, dtype)
        self.residual = rand(rows, n)
        if kernel == "qkv":
            positions = min(spec.max_positions, 4096)
            self.rope = RopeTable(spec.head_dim, positions, spec.rope_theta, device, dtype)
            self.positions = torch.randint(0, positions, (rows,), generator=gen).to(device)
            self.slots = torch.randperm(2 * rows, generator=gen)[:rows].to(device)
        self.want = self._reference()

    def _reference(self) -> list:
        s, f32 = self.spec, lambda t: t.float()  # noqa: E731
        if self.kernel in ("o", "down"):
            return [f32(self.residual) + f32(self.x) @ f32(self.weight).T]
        h = rms_norm(f32(self.x), f32(self.norm), s.rms_norm_eps) @ f32(self.weight).T
        if self.kernel == "head":
            return [h]
        if self.kernel == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            return [F.silu(gate) * up]
        q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        q, k, v = h.split((q, kv, kv), dim=-1)
        cos, sin = (f32(t) for t in self.rope.at(self.positions))
        rotated = [apply_rope(t.unflatten(-1, (-1, s.head_dim)), cos, sin) for t in (q, k)]
        return [rotated[0].flatten(1), rotated[1], v.unflatten(-1, (-1, s.head_dim))]

    def run(self, launch: dict) -> list:
        s, common = self.spec, {"sm_count": self.sm_count, "pdl": self.pdl, **launch}
        if self.kernel in ("o", "down"):
            return [few_row_linear(self.x, self.weight, residual=self.residual, **common)]
        if self.kernel == "head" and launch.get("cublas"):  # as fused_head runs it
            _, h = add_rms_norm(self.x, None, self.norm, s.rms_norm_eps, pdl=common["pdl"])
            return [F.linear(h, self.weight).float()]
        if self.kernel == "head":
            return [
                few_row_linear(
                    self.x,
                    self.weight,
                    norm=self.norm,
                    eps=s.rms_norm_eps,
                    out_dtype=torch.float32,
                    **common,
                )  # fmt: skip
            ]
        if self.kernel == "swiglu":
            return [norm_swiglu(self.x, self.norm, self.weight, s.rms_norm_eps, **common)]
        pool = (2 * len(self.slots), s.num_kv_heads, s.head_dim)
        k_pool, v_pool = (self.x.new_zeros(pool) for _ in "kv")
        q = norm_qkv_rope(
            self.x, self.norm, self.weight, s.rms_norm_eps, s.head_dim, s.num_heads * s.head_dim,
            self.rope.cos, self.rope.sin, k_pool, v_pool, self.slots, positions=self.positions,
            **common,
        )  # fmt: skip
        return [q, k_pool[self.slots], v_pool[self.slots]]

    def error(self, launch: dict) -> float:
        got = self.run(launch)
        return max(float((g.float() - w).abs().max()) for g, w in zip(got, self.want))


class KnobBench:
    """A bench (`error`, `time_ms` of a launch) driven by the search's knobs (`launch_of`)."""

    def __init__(self, bench):
        self.bench, self.build_launch = bench, bench.build

    def error(self, knobs: dict) -> float:
        return self.bench.error(launch_of(knobs))

    def time_ms(self, knobs: dict) -> float:
        return self.bench.time_ms(launch_of(knobs))

    def build(self, knobs: dict) -> None:
        self.build_launch(launch_of(knobs))


def engine_table(engine) -> dict:
    """The (kernel, rows) table `engine`'s fused stack and head read when a decode step is
    captured: its file's FEW_ROW_KNOBS, bound to both. A launch the search times goes in here;
    the dict the file was written from is a copy the engine never reads."""
    return engine.model.layers.keywords["knobs"]


def row_buckets(config: dict, buckets: list, most_rows: int = HEAD_MAX_ROWS) -> list:
    """The row buckets the traces' decode steps reach (`trace_buckets` over the decode graphs'
    (rows, context) `buckets`), the heaviest first: each timed at its heaviest context's
    lengths, weighing what all its contexts weigh."""
    found: dict = {}
    for b in trace_buckets(config, buckets):
        if b.rows > most_rows:
            continue
        had = found.get(b.rows)
        found[b.rows] = b if had is None else (
            replace(had, steps=had.steps + b.steps, weight=had.weight + b.weight)
        )  # fmt: skip
    return sorted(found.values(), key=lambda b: (-b.weight, -b.steps))


def prior_table(spec: ModelSpec, variant, prior: str, device) -> dict:
    """(kernel, rows) -> the launch of every kernel at every decode graph row bucket as
    `prior` starts it: empty for the hand rules (the launchers' own), NEUTRAL_TILES else."""
    if prior == "hand":
        return {}
    device = torch.device(device)
    sm_count, pdl = device_sm_count(device), variant.layers == "fused-pdl"
    policy = variant.graphs if variant.graphs != "off" else "pow2"
    rows = sorted({r for r, _ in graph_buckets(spec, device_capability(device), policy)})
    return {
        (kernel, r): launch_of(prior_launch(kernel, r, spec, sm_count, pdl, prior))
        for r in rows for kernel in kernels_at(r, pdl)
    }  # fmt: skip


def seeds(kernel: str, rows: int, results: list, most: int = 2) -> tuple:
    """What the search found for `kernel` at other row buckets (nearest_found), the nearest row
    counts first."""
    mine = [found for k, found in results if k == kernel]
    return nearest_found(mine, lambda b: b.rows, rows, most)


def tune(config: dict, weight_dir: str, variant, budget_s: float = 120.0, device="cuda",
         log=print, bench=StepBench, check=FewRowCheck, prior: str = "hand") -> tuple:  # fmt: skip
    """(table, results): (kernel, rows) -> the launch found where it beats the rules' (with the
    neutral `prior`: every bucket's, the neutral launch where nothing beat it), and what the
    search did per (kernel, rows bucket), the heaviest buckets first. `bench` and `check` make a
    bucket's StepBench and FewRowCheck (the tests' fakes elsewhere)."""
    spec = ModelSpec.from_config(config)
    device = torch.device(device)
    sm_count, capability = device_sm_count(device), device_capability(device)
    pdl = variant.layers == "fused-pdl"
    # a kernel's own PDL: the fused stack launches the attention so with the output projection
    has_pdl = variant.attention == "triton" and pdl_supported(device)
    policy = variant.graphs if variant.graphs != "off" else "pow2"
    buckets = row_buckets(config, graph_buckets(spec, capability, policy))
    work = [(b, kernel) for b in buckets for kernel in kernels_at(b.rows, pdl)]
    base = prior_table(spec, variant, prior, device)
    if not work or budget_s <= 0:
        return base, []
    priors = {(k, b.rows): prior_launch(k, b.rows, spec, sm_count, pdl, prior) for b, k in work}
    live = {**base, **{key: launch_of(knobs) for key, knobs in priors.items()}}  # its file's
    engine = build_engine(config, weight_dir, str(device), variant, few_row_knobs=live)
    live = engine_table(engine)  # what a bucket's step is captured with is what is timed
    deadline = time.monotonic() + budget_s  # (the engine's build is not the search's)
    results = []
    for i, (bucket, kernel) in enumerate(work):
        if time.monotonic() > deadline:
            break
        key = (kernel, bucket.rows)
        checked = check(kernel, spec, bucket.rows, device, spec.config_dtype, pdl, sm_count)
        step = bench(engine, bucket, checked, spec.vocab_size, table=live, key=key)
        # a bucket's weight shared out over its kernels
        left = [replace(b, weight=b.weight / len(kernels_at(b.rows, pdl))) for b, _ in work[i:]]
        until = share_deadline(time.monotonic(), deadline, left)
        values = functools.partial(candidates, kernel, has_pdl=has_pdl)
        knobs = KnobBench(step)
        neutral = prior_launch(kernel, bucket.rows, spec, sm_count, pdl, "neutral")
        again = (neutral,) if prior == "hand" else ()  # from the rules, again from neutral
        found = tune_bucket(knobs, priors[key], spec, bucket, sm_count, until, AXES, values,
                            seeds(kernel, bucket.rows, results), knobs.build, again)  # fmt: skip
        engine.remove(step.ids)
        live[key] = launch_of(found.best)
        results.append((kernel, found))
        log(f"  {kernel:6s} at {bucket.rows:3d} rows (weight {bucket.weight:.2f}): a step "
            f"{found.outcome()}")  # fmt: skip
    del engine
    if prior != "hand":
        return live, results
    return {k: v for k, v in live.items() if v != launch_of(priors[k])}, results


def summary(results: list) -> list:
    """The per-(kernel, rows) results as plain data (the cache file, the CLI's json)."""
    return [
        {"kernel": kernel, "rows": r.bucket.rows, "steps": r.bucket.steps,
         "weight": round(r.bucket.weight, 2), "prior_us": round(r.prior_ms * 1e3, 1),
         "best_us": round(r.best_ms * 1e3, 1), "tried": r.tried, "rejected": len(r.rejected),
         "moved": r.moved}
        for kernel, r in results
    ]  # fmt: skip


def table_to_json(table: dict) -> dict:
    """Each (kernel, rows) as "kernel@rows" -> its launch (tiles as lists)."""
    return {
        f"{kernel}@{rows}": {
            name: list(value) if name == "tiles" else value for name, value in launch.items()
        }
        for (kernel, rows), launch in table.items()
    }


def table_from_json(data: dict) -> dict:
    table = {}
    for key, launch in data.items():
        kernel, rows = key.split("@")
        table[kernel, int(rows)] = {
            name: tuple(value) if name == "tiles" else value for name, value in launch.items()
        }
    return table


def load_or_tune(config, weight_dir, variant, folder, budget_s=120.0, device="cuda", log=print,
                 prior="hand"):  # fmt: skip
    """(table, results, path): the cached table for this machine, model shape, layout and
    prior, or a new search, cached in `folder`."""
    spec = ModelSpec.from_config(config)
    key = {**machine_key(spec, variant, prior, torch.device(device)), "kernels": "few_row",
           "search": SEARCH_VERSION}  # fmt: skip
    search = functools.partial(searched, tune, summary, config, weight_dir, variant, budget_s,
                               device, log=log, prior=prior)  # fmt: skip
    return cached_search(folder, key, "few_row", search, table_to_json, table_from_json)


def main(argv=None) -> int:
    parser = kernel_parser(__doc__)
    args = parser.parse_args(argv)
    config, variant = kernel_target(args)
    if variant.layers not in ("fused", "fused-pdl"):
        parser.error(f"layers {variant.layers!r} run no few-row kernels (fused or fused-pdl do)")
    if variant.graphs == "off" or variant.attention != "triton":
        # the buckets timed are those our attention's graphs capture under the rules
        parser.error(
            "the search times the decode graphs: the variant needs graphs and our attention"
        )
    if not torch.cuda.is_available():
        parser.error("the search times kernels on a GPU: no CUDA device here")
    target = (config, args.weight_dir, variant)
    load = lambda folder: load_or_tune(*target, folder, args.budget, prior=args.prior)  # noqa: E731
    search = functools.partial(searched, tune, summary, *target, args.budget, prior=args.prior)
    return search_command(args, load, search, table_to_json, "kernel buckets")


if __name__ == "__main__":
    raise SystemExit(main())
