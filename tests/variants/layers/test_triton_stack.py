"""The fused Triton decoder stack (and the Triton attention backend) inside the real engine, run
on the CPU by Triton's interpreter in float32, against the reference: prefill of ragged prompts,
ragged decode, eager and through the CUDA-graph body (replayed eagerly on its static buffers)."""

import pytest

pytest.importorskip("triton")

from variants.attention.sdpa import SdpaAttention  # noqa: E402
from variants.attention.triton_attention import TritonAttention  # noqa: E402
from variants.cache.paged import PagedKVCache  # noqa: E402
from variants.cache.slab import SlabKVCache  # noqa: E402
from variants.engine import assemble_engine  # noqa: E402
from variants.layers.torch_stack import run_torch_stack  # noqa: E402
from variants.layers.triton_stack import run_triton_stack  # noqa: E402
from variants.variant import Variant  # noqa: E402

CASES = [
    ("slab-triton-attn", SlabKVCache, TritonAttention, run_torch_stack,
     Variant(cache="slab", attention="triton")),
    ("slab-triton-stack", SlabKVCache, TritonAttention, run_triton_stack,
     Variant(cache="slab", attention="triton", layers="triton")),
    ("paged16-sdpa-triton-stack-unfused", PagedKVCache, SdpaAttention, run_triton_stack,
     Variant(cache="paged", block_size=16, layers="triton", fuse_qkv=False)),
]  # fmt: skip


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-body"])
@pytest.mark.parametrize(
    "name,cache_cls,attention_cls,stack,variant", CASES, ids=[c[0] for c in CASES]
)
def test_matches_the_reference(name, cache_cls, attention_cls, stack, variant, graphs,
                               tiny_config, sharp_weights, reference_gap,
                               emulate_graphs):  # fmt: skip
    engine = assemble_engine(
        tiny_config, sharp_weights, "cpu", cache_cls=cache_cls, attention_cls=attention_cls,
        stack=stack, fuse_qkv=variant.fuse_qkv,
    )  # fmt: skip
    if graphs:
        emulate_graphs(engine)
    worst = reference_gap(engine)
    assert worst < 1e-4, worst
