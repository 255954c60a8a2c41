"""Known-good assemblies, safest first: enqueued at the start of a study and used as the
fallback list when Optuna is unavailable. Each is kept only if the capability probe allows it."""

from __future__ import annotations

from variants.variant import Variant

PRESETS: dict[str, Variant] = {
    # Closest to the reference: float32 scores, no fusions, no compilation.
    "safest": Variant(cache="slab", attention="manual", fuse_qkv=False, fuse_gate_up=False),
    "slab-sdpa": Variant(cache="slab", attention="sdpa"),
    "paged-sdpa": Variant(cache="paged", block_size=64, attention="sdpa"),
    "slab-sdpa-compile": Variant(cache="slab", attention="sdpa", execution="compile"),
}


def ranked_defaults(caps) -> list[Variant]:
    """The presets this machine can run, in order of how safe they are."""
    return [v for v in PRESETS.values() if caps.why_invalid(v) is None]
