"""torch.compile execution: the ONE compiled engine of the CPU suite (Inductor on CPU takes about
a minute). It must match the eager engine and the reference, and all compilation must happen in
create_engine's warm-up: no timed call may recompile."""

import pytest
import torch
import torch._dynamo.utils as dynamo_utils

from evaluator.reference_model import ReferenceModel
from evaluator.traces import Decode, Prefill, Remove, Trace, materialize
from variants import Variant, build_engine

# Batch sizes and prompt lengths outside the warm-up's (1-3 requests, 3-14 tokens): with
# dynamic shapes none of them may trigger a new graph.
TRACE = Trace(
    "compile_check",
    (
        Prefill([0], [11]),
        Decode([0]),
        Prefill([1, 2, 5, 6], [7, 40, 1, 2]),
        Decode([0, 1, 2, 5, 6]),
        Remove([1]),
        Prefill([3], [5]),
        Decode([6, 0, 2, 3]),
        Decode([3, 2]),
    ),
)


@pytest.mark.slow
def test_compiled_engine_matches_eager_and_compiles_only_in_warm_up(tiny_config, sharp_weights):
    variant = Variant(cache="slab", attention="sdpa", execution="compile")
    torch._dynamo.reset()
    engine = build_engine(tiny_config, sharp_weights, "cpu", variant)
    graphs = dynamo_utils.counters["stats"]["unique_graphs"]
    assert graphs > 0  # something was compiled in create_engine
    eager = build_engine(tiny_config, sharp_weights, "cpu", Variant(cache="slab"))
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    history = {}
    for op, ids, *rest in materialize(TRACE, tiny_config["vocab_size"], "cpu", seed=4):
        if op == "remove":
            engine.remove(ids)
            eager.remove(ids)
            continue
        tokens = rest[0]
        for i, rid in enumerate(ids):
            new = tokens[i] if op == "prefill" else torch.cat([history[rid], tokens[i : i + 1]])
            history[rid] = new
        out = getattr(engine, op)(ids, tokens)
        want = getattr(eager, op)(ids, tokens)
        assert out.dtype == torch.float32 and out.shape == (len(ids), 256)
        assert (out - want).abs().max().item() < 1e-4, (op, ids)
        expected = torch.stack([ref.forward(history[r][None])[0, -1] for r in ids])
        assert (out - expected).abs().max().item() < 5e-4, (op, ids)
    assert dynamo_utils.counters["stats"]["unique_graphs"] == graphs, "a timed call recompiled"
