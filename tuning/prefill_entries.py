"""The fused layers' prefill projections searched per prefill graph bucket: the BLAS library
their GEMMs run on and the share of each projection's weight the short kernel before it asks
into L2 (the few-row table's ("prefill", tokens) entries, read by `run_triton_stack`).

A prefill's four projections a layer are cuBLAS GEMMs (no Triton GEMM of ours reached cuBLAS at
a prefill's rows: docs/PERF.md), each after a short kernel that leaves HBM mostly idle (the norms
before QKV and gate-up, RoPE before the output projection, SiLU-mul before down). Two knobs a
token bucket: `library`, torch's default or cuBLASLt where torch offers the choice (2.3 and
newer, CUDA), and `ahead`, none, a quarter, half or all of the next weight. A candidate must
match the reference first (`EntryCheck`: the GEMMs under its library against float32, the short
kernels' outputs with its prefetch against theirs without), then it is timed as the engine's own
prefill graph for the bucket, captured again with it (`PrefillBench`). `few_row.tune` runs it
after the decode buckets, in the same budget, by `decode_attention.tune_bucket`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tuning.decode_attention import replay_ms
from variants.kernels.fused_norm import add_rms_norm
from variants.kernels.fused_rope import rope_and_cache_write
from variants.kernels.fused_silu import silu_mul
from variants.layers.projections import blas_library
from variants.spec import ModelSpec

AXES = ("library", "ahead")
AHEAD = (0.0, 0.25, 0.5, 1.0)  # shares of the next weight asked for
PRIOR = {"library": "default", "ahead": 0.0}  # the rules: no entry


def libraries(device) -> tuple:
    """The libraries a prefill's GEMMs may run on here: cuBLASLt beside the default only where
    torch can pick it, on CUDA (a CPU build of torch refuses it)."""
    device = torch.device(device)
    has = hasattr(torch.backends.cuda, "preferred_blas_library") and device.type == "cuda"
    return ("default", "cublaslt") if has else ("default",)


def entry_of(knobs: dict) -> dict:
    """The table's entry for the knobs: what differs from the rules (empty: the rules)."""
    entry = {}
    if knobs["library"] != "default":
        entry["library"] = knobs["library"]
    if knobs["ahead"]:
        entry["ahead"] = knobs["ahead"]
    return entry


def candidates(libs: tuple, axis: str, current: dict, spec, bucket, sm_count) -> list:
    """An axis's values, the current one first (`tune_bucket`'s `values`)."""
    values = libs if axis == "library" else AHEAD
    return [current[axis]] + [v for v in values if v != current[axis]]


class EntryCheck:
    """A bucket's projections and short kernels at its token count, at the model's shapes:
    `error(knobs)` is the largest of each GEMM's error under the knobs' library against float32
    and each short kernel's difference with the knobs' prefetch from its output without."""

    def __init__(self, spec: ModelSpec, tokens: int, device, dtype):
        gen = torch.Generator().manual_seed(tokens)
        rand = lambda *shape, scale=1.0: (  # noqa: E731
            (scale * torch.randn(*shape, generator=gen)).to(device, dtype)
        )
        h, inter, d = spec.hidden_size, spec.intermediate_size, spec.head_dim
        q, kv = spec.num_heads * d, spec.num_kv_heads * d
        shapes = {
            "qkv": (q + 2 * kv, h), "o": (h, q), "gate_up": (2 * inter, h), "down": (h, inter)
        }  # fmt: skip
        self.weights = {name: rand(n, k, scale=k**-0.5) for name, (n, k) in shapes.items()}
        self.inputs = {name: rand(tokens, k) for name, (_, k) in shapes.items()}
        self.gemms_want = {
            name: self.inputs[name].float() @ w.float().T for name, w in self.weights.items()
        }
        self.device, self.eps = torch.device(device), spec.rms_norm_eps
        x, delta, norm = rand(tokens, h), rand(tokens, h), 1 + 0.1 * rand(h)
        gate, up = self.inputs["down"], rand(tokens, inter)
        qs = rand(tokens, spec.num_heads, d)
        ks, vs = rand(tokens, spec.num_kv_heads, d), rand(tokens, spec.num_kv_heads, d)
        positions = min(spec.max_positions, 4096)
        cos, sin = rand(positions, d // 2), rand(positions, d // 2)
        at = torch.randint(0, positions, (tokens,), generator=gen).to(device)
        slots = torch.randperm(2 * tokens, generator=gen)[:tokens].to(device)
        w = self.weights

        def rope(**ahead):
            pools = [qs.new_zeros(2 * tokens, spec.num_kv_heads, d) for _ in "kv"]
            out = rope_and_cache_write(qs, ks, vs, cos, sin, *pools, slots, positions=at, **ahead)
            return [out, *pools]

        # each short kernel with the weight it asks for in a prefill (triton_stack)
        self.short = {
            "norm": (lambda **a: list(add_rms_norm(x, delta, norm, self.eps, **a)), w["qkv"]),
            "rope": (rope, w["o"]),
            "silu": (lambda **a: [silu_mul(gate, up, **a)], w["down"]),
        }
        self.short_want = {name: call() for name, (call, _) in self.short.items()}

    def run(self, knobs: dict) -> tuple:
        library = entry_of(knobs).get("library")
        with blas_library(library, self.device):
            gemms = {name: F.linear(self.inputs[name], w) for name, w in self.weights.items()}
        share = knobs["ahead"]
        short = {
            name: call(**({"ahead": weight, "ahead_share": share} if share else {}))
            for name, (call, weight) in self.short.items()
        }
        return gemms, short

    def build(self, knobs: dict) -> None:
        self.run(knobs)

    def error(self, knobs: dict) -> float:
        gemms, short = self.run(knobs)
        gap = lambda got, want: float((got.float() - want.float()).abs().max())  # noqa: E731
        errors = [gap(gemms[name], want) for name, want in self.gemms_want.items()]
        for name, wants in self.short_want.items():
            errors += [gap(got, want) for got, want in zip(short[name], wants)]
        return max(errors)


class PrefillBench:
    """An entry timed where it runs: the engine's prefill graph for the bucket, captured again
    with the entry in `table` at `key` and replayed back to back at the bucket's prompt lengths
    (the bucket's prompts prefilled through it, so its buffers hold their lengths); its
    correctness from `check`."""

    def __init__(self, engine, bucket, check, vocab: int, table: dict, key: tuple):
        self.engine, self.bucket, self.check, self.table, self.key = (
            engine, bucket, check, table, key
        )  # fmt: skip
        gen = torch.Generator().manual_seed(bucket.tokens)
        self.ids = list(range(1 << 21, (1 << 21) + len(bucket.lengths)))
        self.prompts = [
            torch.randint(0, vocab, (n,), generator=gen).to(engine.device) for n in bucket.lengths
        ]

    def error(self, knobs: dict) -> float:
        return self.check.error(knobs)

    def build(self, knobs: dict) -> None:
        self.check.build(knobs)

    def time_ms(self, knobs: dict, replays: int = 20, rounds: int = 3) -> float:
        """The median GPU time of the bucket's prefill graph captured with the knobs' entry.
        A call whose pool moved runs eagerly (prefill_graphs.py): then it is made again."""
        e, t = self.engine, self.bucket.tokens
        runner = e.prefill_runner
        self.table[self.key] = entry_of(knobs)
        for _ in range(3):
            if any(r in e.lengths for r in self.ids):
                e.remove(self.ids)
            stale = runner.graphs.pop(t, None)  # released after the capture (StepBench)
            runner.asked.add(t)  # captured by the next call, not run eagerly first
            e.prefill(self.ids, self.prompts)
            del stale
            if t in runner.graphs:
                return replay_ms(runner.graphs[t], replays, rounds)
        raise RuntimeError(f"the {t}-token prefill graph was not captured")
