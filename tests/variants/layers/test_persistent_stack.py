"""The persistent-layer stack inside the real engine, run on the CPU by Triton's interpreter in
float32 (one launch a phase there), against the reference: ragged prefill (the Triton stack) and
ragged decode (the persistent layers), eager and through the CUDA-graph body; and on the GPU the
whole layer as one launch with its grid barriers."""

import pytest
import torch

pytest.importorskip("triton")

from variants.attention.triton_attention import TritonAttention  # noqa: E402
from variants.cache.paged import PagedKVCache  # noqa: E402
from variants.cache.slab import SlabKVCache  # noqa: E402
from variants.engine import assemble_engine  # noqa: E402
from variants.execution.eager import run_eager  # noqa: E402
from variants.kernels import decode_layer  # noqa: E402
from variants.layers.fused_stack import fused_head  # noqa: E402
from variants.layers.persistent_stack import run_persistent_stack  # noqa: E402
from variants.variant import Variant  # noqa: E402

CASES = [
    ("slab", SlabKVCache, Variant(cache="slab", attention="triton")),
    ("paged16", PagedKVCache, Variant(cache="paged", block_size=16, attention="triton")),
]


def _engine(tiny_config, sharp_weights, cache_cls, variant):
    variant = Variant.from_dict({**variant.to_dict(), "layers": "persistent"})
    return assemble_engine(
        tiny_config, sharp_weights, "cpu", variant, cache_cls, TritonAttention, run_eager,
        run_persistent_stack, head=fused_head,
    )  # fmt: skip


@pytest.mark.parametrize(
    "name,cache_cls,variant,graphs",
    [(*CASES[0], False), (*CASES[1], True)],
    ids=["slab-eager", "paged16-graph-body"],
)
def test_matches_the_reference_one_phase_a_launch(
    name, cache_cls, variant, graphs, tiny_config, sharp_weights, reference_gap, emulate_graphs,
    monkeypatch,
):  # fmt: skip
    """The interpreter cannot wait at a grid barrier: every launch there runs one phase."""
    spans = []
    real = decode_layer.DecodeLayers._launch

    def record(self, args, first, last):
        spans.append((first, last))
        return real(self, args, first, last)

    monkeypatch.setattr(decode_layer.DecodeLayers, "_launch", record)
    engine = _engine(tiny_config, sharp_weights, cache_cls, variant)
    if graphs:
        emulate_graphs(engine)
    spans.clear()
    worst = reference_gap(engine)
    assert worst < 1e-4, worst
    layers = tiny_config["num_hidden_layers"]
    assert spans == [(p, p) for p in range(1, 6)] * (4 * layers)  # four decode steps


def test_refuses_more_rows_than_one_tile(tiny_spec):
    with pytest.raises(AssertionError, match="17 rows"):
        decode_layer.DecodeLayers(tiny_spec, 17, 64, "cpu", torch.float32, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("cache", ["slab", "paged"])
def test_gpu_graphed_persistent_engine_matches_the_reference(cache, tmp_path, graphed_engine_gap):
    """Real CUDA graphs with the persistent layers at batches 1, 8 and 16 (one launch a layer,
    grid barriers between phases); 64 and 65 run the Triton stack."""
    graphed_engine_gap("persistent", cache, tmp_path)


def test_routes_by_rows(tiny_config, sharp_weights, reference_gap, monkeypatch, count_calls):
    """With the limit lowered to 3 rows, the scenario's decode steps of 3, 4, 1 and 4 rows take
    both stacks, still exact: the persistent layers at 3 and 1 rows, the Triton stack at 4."""
    from variants.layers import persistent_stack

    monkeypatch.setattr(persistent_stack, "MAX_ROWS", 3)
    calls = count_calls(persistent_stack, ["run_triton_stack", "DecodeLayers"])
    engine = _engine(tiny_config, sharp_weights, *CASES[0][1:])
    calls.update(dict.fromkeys(calls, 0))  # the warm-up ran every path
    assert reference_gap(engine) < 1e-4
    assert calls == {"run_triton_stack": 3, "DecodeLayers": 2}  # prefill + two 4-row steps
