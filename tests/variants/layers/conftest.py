"""Shared by the stack tests: the CUDA-graph body replayed eagerly on its static buffers, and a
ragged prefill + decode scenario scored against the reference model."""

import pytest
import torch

from evaluator.reference_model import ReferenceModel
from variants.execution.cuda_graphs import DecodeGraphs


def _emulate_graphs(engine, largest_batch: int = 4) -> None:
    """Route the engine's decode steps through DecodeGraphs with each 'replay' running the
    captured body eagerly (what a graph replays), so the CPU exercises the static buffers."""
    graphs = DecodeGraphs(engine, "pow2", largest_batch=largest_batch)

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


@pytest.fixture
def emulate_graphs():
    return _emulate_graphs


@pytest.fixture
def reference_gap(tiny_config, sharp_weights):
    """scenario(engine) -> the largest |logit - reference logit| over a ragged prefill of four
    prompts (1 to 140 tokens) and four ragged decode steps."""
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")

    def scenario(engine) -> float:
        gen = torch.Generator().manual_seed(5)
        history, worst = {}, 0.0
        lengths = {7: 5, 3: 140, 11: 1, 900: 33}
        prompts = [torch.randint(0, 256, (n,), generator=gen) for n in lengths.values()]
        out = engine.prefill(list(lengths), prompts)
        for i, rid in enumerate(lengths):
            history[rid] = prompts[i].tolist()
            want = ref.forward(torch.tensor(history[rid])[None])[0, -1]
            worst = max(worst, (out[i] - want).abs().max().item())
        for ids in ([3, 11, 7], [11, 3, 900, 7], [900], [7, 3, 11, 900]):
            tokens = torch.randint(0, 256, (len(ids),), generator=gen)
            out = engine.decode(ids, tokens)
            for i, rid in enumerate(ids):
                history[rid].append(int(tokens[i]))
                want = ref.forward(torch.tensor(history[rid])[None])[0, -1]
                worst = max(worst, (out[i] - want).abs().max().item())
        return worst

    return scenario
