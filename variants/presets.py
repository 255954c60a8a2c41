"""Known-good assemblies, the fastest measured first: enqueued at the start of a study and used
as the fallback list when Optuna is unavailable (each is measured, the best verified one wins).
Each is kept only if the capability probe allows it."""

from __future__ import annotations

from variants.variant import Variant

# The GPU presets start with a larger first cache (the largest the search offers for a slab, the
# middle one for a paged pool): the slab of 131072 tokens was as fast or faster than one of
# 8192 on every trace, the serving traces the most (its pool does not move and its graphs
# do not capture again inside a call), and a paged pool of 32768 holds all three serving traces
# (docs/PERF.md).
SLAB = {"cache": "slab", "cache_tokens": 131072}
PAGED64 = {"cache": "paged", "block_size": 64, "cache_tokens": 32768}
# whole-step CUDA graphs (decode, and prefill at token buckets) over our Triton attention
ALL_GRAPHS = {"attention": "triton", "graphs": "pow2", "prefill_graphs": "pow2"}

PRESETS: dict[str, Variant] = {
    # Hopper and newer only: the same with each fused kernel launched with programmatic
    # dependent launch, its weights (and the attention's keys and values) prefetched into L2
    # while the kernel before runs (faster on the decode and mixed traces, prefill within
    # noise; experiments/variant_table.py).
    "slab-triton-pdl-allgraphs": Variant(**SLAB, **ALL_GRAPHS, layers="fused-pdl"),
    # GPU fast path first (the probe drops them elsewhere): the graphs over our fused Triton
    # kernels, the fastest assemblies measured, then over plain ops. "gemv": the
    # decode step's projections on our few-row kernels with the norms, RoPE, SiLU and residual
    # adds fused in (faster than the Triton stack on the decode, mixed, continuous, wide and
    # long traces).
    "slab-triton-gemv-allgraphs": Variant(**SLAB, **ALL_GRAPHS, layers="fused"),
    "paged64-triton-gemv-allgraphs": Variant(**PAGED64, **ALL_GRAPHS, layers="fused"),
    "slab-triton-fused-allgraphs": Variant(**SLAB, **ALL_GRAPHS, layers="triton"),
    "paged64-triton-fused-allgraphs": Variant(**PAGED64, **ALL_GRAPHS, layers="triton"),
    "slab-triton-fused-graphs": Variant(**SLAB, attention="triton", layers="triton", graphs="pow2"),
    "slab-sdpa-graphs": Variant(**SLAB, attention="sdpa", graphs="pow2"),
    "slab-sdpa": Variant(cache="slab", attention="sdpa"),
    "paged-sdpa": Variant(cache="paged", block_size=64, attention="sdpa"),
    "slab-sdpa-compile": Variant(cache="slab", attention="sdpa", execution="compile"),
    # Closest to the reference: float32 scores, no fusions, no compilation; the last resort.
    "safest": Variant(cache="slab", attention="manual", fuse_qkv=False, fuse_gate_up=False),
}


def ranked_defaults(caps) -> list[Variant]:
    """The presets this machine can run, fastest expected first, the safest last."""
    return [v for v in PRESETS.values() if caps.why_invalid(v) is None]
