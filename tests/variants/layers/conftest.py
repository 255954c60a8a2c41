"""Shared by the stack tests: the CUDA-graph body replayed eagerly on its static buffers, and a
ragged prefill + decode scenario scored against the reference model."""

import pytest
import torch

from evaluator.reference_model import ReferenceModel


@pytest.fixture
def emulate_graphs(emulate_decode_graphs):
    """engine -> its decode steps routed through emulated graphs (buckets up to 4 rows)."""
    return lambda engine, largest_batch=4: emulate_decode_graphs(engine, largest_batch, warm=True)


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


def _graphed_engine_gap(layers: str, cache: str, tmp_path) -> None:
    """The public config in float16 with real CUDA graphs, `layers` for the decoder stack:
    65 requests (one of 1500 tokens, the rest 5-197), decode at batches 1, 8, 16, 32, 64 and
    65 (past the largest bucket: eager), up to 8 rows a step checked against the reference."""
    import json
    from pathlib import Path

    from evaluator.toy_weights import save_toy_weights
    from variants import build_engine
    from variants.variant import Variant

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    config = json.loads((Path(__file__).parents[3] / "target/model_config.json").read_text())
    save_toy_weights(config, tmp_path / "model.pt")
    variant = Variant(cache=cache, block_size=64, attention="triton", layers=layers,
                      graphs="pow2", prefill_graphs="pow2")  # fmt: skip
    engine = build_engine(config, str(tmp_path), "cuda", variant)
    ref = ReferenceModel(config, str(tmp_path), "cuda")
    gen = torch.Generator().manual_seed(0)
    history = {}
    for rid in range(65):
        length = 1500 if rid == 0 else 5 + 3 * rid
        prompt = torch.randint(0, config["vocab_size"], (length,), generator=gen)
        engine.prefill([rid], [prompt.cuda()])
        history[rid] = prompt.tolist()
    for batch in (1, 8, 16, 32, 64, 65):
        ids = list(range(batch))
        tokens = torch.randint(0, config["vocab_size"], (batch,), generator=gen)
        out = engine.decode(ids, tokens.cuda())
        for rid in ids:
            history[rid].append(int(tokens[rid]))
        for rid in ids[:: max(1, batch // 8)]:  # up to 8 rows checked a step
            want = ref.forward(torch.tensor(history[rid], device="cuda")[None])[0, -1].float()
            torch.testing.assert_close(out[rid], want, atol=1e-2, rtol=1e-2)


@pytest.fixture
def graphed_engine_gap():
    return _graphed_engine_gap


@pytest.fixture
def count_calls(monkeypatch):
    """count_calls(module, names) -> a dict of call counts, each name in `module` wrapped so
    that a call through the module adds one to its count."""

    def wrap(module, names) -> dict:
        calls = dict.fromkeys(names, 0)
        for name in names:
            real = getattr(module, name)

            def count(*args, _name=name, _real=real, **kwargs):
                calls[_name] += 1
                return _real(*args, **kwargs)

            monkeypatch.setattr(module, name, count)
        return calls

    return wrap
