"""The Variant: one frozen dataclass naming a choice per axis (the genome of an engine).

Defaults are the safest assembly that runs everywhere; the registry says which axes exist for a
given partial choice and the capability probe says which choices this machine offers.
"""

import dataclasses
from dataclasses import dataclass

from variants.cache.pool import FIRST_CACHE_TOKENS


@dataclass(frozen=True)
class Variant:
    cache: str = "slab"  # contiguous | slab | paged
    block_size: int = 16  # paged only
    cache_tokens: int = (
        FIRST_CACHE_TOKENS  # the first pool's size (slab, paged); it grows when work needs more
    )
    prefix_cache: bool = False  # paged, eager, torch layers only; set by hand, never searched
    attention: str = "sdpa"  # manual | sdpa | flex | triton
    sdpa_backend: str = "auto"  # sdpa only: auto | flash | efficient | math | cudnn
    execution: str = "eager"  # eager | compile
    compile_mode: str = "default"  # compile only
    graphs: str = "off"  # CUDA-graph decode buckets: off | pow2 | every8
    prefill_graphs: str = "off"  # CUDA-graph prefill at token buckets: off | pow2
    layers: str = "torch"  # torch | triton | fused (+ GEMVs) | fused-pdl
    fuse_qkv: bool = True
    fuse_gate_up: bool = True
    dtype: str = "config"  # config | float16 | bfloat16 | float32

    def to_dict(self) -> dict:
        """Every field, less `prefix_cache` when off (the search never sets it): the dict of a
        searched variant (study records, rendered engines) names only the axes it walks."""
        values = dataclasses.asdict(self)
        if not self.prefix_cache:
            del values["prefix_cache"]
        return values

    @classmethod
    def from_dict(cls, values: dict) -> "Variant":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown variant field(s): {sorted(unknown)}")
        return cls(**values)

    @property
    def name(self) -> str:
        parts = [self.cache + (f"{self.block_size}" if self.cache == "paged" else "")]
        if self.prefix_cache:
            parts.append("prefix")
        parts.append(f"sdpa-{self.sdpa_backend}" if self.attention == "sdpa" else self.attention)
        parts.append(
            f"compile-{self.compile_mode}" if self.execution == "compile" else self.execution
        )
        if self.layers != "torch":
            parts.append(f"layers-{self.layers}")
        if self.graphs != "off":
            parts.append(f"graphs-{self.graphs}")
        if self.prefill_graphs != "off":
            parts.append(f"prefill-graphs-{self.prefill_graphs}")
        fused = [n for n, on in (("qkv", self.fuse_qkv), ("gateup", self.fuse_gate_up)) if on]
        parts.append("fused-" + "+".join(fused) if fused else "unfused")
        parts.append(self.dtype)
        return "/".join(parts)
