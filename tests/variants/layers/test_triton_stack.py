"""The fused Triton decoder stack (and the Triton attention backend) inside the real engine, run
on the CPU by Triton's interpreter in float32, against the reference: prefill of ragged prompts,
ragged decode, eager and through the CUDA-graph body (replayed eagerly on its static buffers)."""

import pytest
import torch

pytest.importorskip("triton")

from evaluator.reference_model import ReferenceModel  # noqa: E402
from variants.attention.sdpa import SdpaAttention  # noqa: E402
from variants.attention.triton_attention import TritonAttention  # noqa: E402
from variants.cache.paged import PagedKVCache  # noqa: E402
from variants.cache.slab import SlabKVCache  # noqa: E402
from variants.engine import assemble_engine  # noqa: E402
from variants.execution.cuda_graphs import DecodeGraphs  # noqa: E402
from variants.execution.eager import run_eager  # noqa: E402
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


def _emulate_graphs(engine):
    graphs = DecodeGraphs(engine, "pow2", largest_batch=4)

    class Replay:
        def __init__(self, b, c):
            self.b, self.c = b, c

        def replay(self):
            graphs._body(self.b, self.c)

    def capture():
        graphs.graphs = {(b, c): Replay(b, c) for b in graphs.batches for c in graphs.contexts}
        graphs.generation = engine.cache.generation

    graphs.capture = capture
    capture()
    engine.decode_step = graphs.step


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-body"])
@pytest.mark.parametrize(
    "name,cache_cls,attention_cls,stack,variant", CASES, ids=[c[0] for c in CASES]
)
def test_matches_the_reference(name, cache_cls, attention_cls, stack, variant, graphs,
                               tiny_config, sharp_weights):  # fmt: skip
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    engine = assemble_engine(
        tiny_config, sharp_weights, "cpu", variant, cache_cls, attention_cls, run_eager, stack
    )
    if graphs:
        _emulate_graphs(engine)
    gen = torch.Generator().manual_seed(5)
    history, worst = {}, 0.0
    lengths = {7: 5, 3: 140, 11: 1, 900: 33}
    prompts = [torch.randint(0, 256, (n,), generator=gen) for n in lengths.values()]
    out = engine.prefill(list(lengths), prompts)
    for i, rid in enumerate(lengths):
        history[rid] = prompts[i].tolist()
        want = ref.forward(torch.tensor(history[rid])[None])[0, -1]
        worst = max(worst, (out[i] - want).abs().max().item())
    for ids in ([3, 11, 7], [11, 3, 900, 7], [900], [7, 3, 11, 900, 3][:4]):
        tokens = torch.randint(0, 256, (len(ids),), generator=gen)
        out = engine.decode(ids, tokens)
        for i, rid in enumerate(ids):
            history[rid].append(int(tokens[i]))
            want = ref.forward(torch.tensor(history[rid])[None])[0, -1]
            worst = max(worst, (out[i] - want).abs().max().item())
    assert worst < 1e-4, worst
