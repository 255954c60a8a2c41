"""FlexAttention: ragged prefill and ragged decode equal per-request attention (GQA included),
and engines on it, from the library and rendered standalone, equal the reference model through
prefills, decodes, a remove and re-prefills. Skipped where torch has no flex_attention."""

import importlib.util

import pytest
import torch

from evaluator.reference_model import ReferenceModel
from variants.attention.flex import FlexAttention
from variants.build import build_engine
from variants.probe import probe_capabilities
from variants.render import render_engine
from variants.variant import Variant

if not probe_capabilities("cpu").has_flex:  # (the module imports without it; the class needs it)
    pytest.skip("FlexAttention needs torch >= 2.5", allow_module_level=True)

# Eager flex says once that it is not compiled: that is the point of this backend on CPU.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

A, B, C = 10**9 + 7, 3, 42
# (op, ids, prompt lengths): ragged prompts across 16-token blocks, ragged decodes, a re-prefill
# of a live id (A, shorter), a removal and the removed id coming back (B).
SCRIPT = (
    ("prefill", [A, B, C], [13, 1, 40]),
    ("decode", [C, A], None),
    ("decode", [B, A, C], None),
    ("prefill", [A], [5]),
    ("decode", [A, B, C], None),
    ("remove", [B], None),
    ("decode", [C, A], None),
    ("prefill", [B], [3]),
    ("decode", [C, B, A], None),
)
TOL = 5e-4  # float32 on CPU, as tests/variants/test_engine.py: a mask or GQA bug moves > 0.1


def flex(spec) -> FlexAttention:
    return FlexAttention(spec, torch.float32)


def sharp(shape, gen, scale=3.0):
    return torch.randn(*shape, generator=gen) * scale


@pytest.mark.parametrize("lengths", [[7, 1, 19, 12], [9, 9]])
def test_prefill_equals_per_request(tiny_spec, prefill_batch, attention_alone, lengths):
    gen = torch.Generator().manual_seed(0)
    total = sum(lengths)
    q, k, v = sharp((total, 4, 24), gen), sharp((total, 2, 24), gen), sharp((total, 2, 24), gen)
    out = flex(tiny_spec).prefill(q, k, v, prefill_batch(lengths))
    assert out.shape == (total, 4 * 24)
    start = 0
    for n in lengths:
        s = slice(start, start + n)
        expected = attention_alone(
            q[s].transpose(0, 1), k[s].transpose(0, 1), v[s].transpose(0, 1), True
        )
        assert torch.allclose(out[s], expected, atol=1e-5, rtol=1e-5), n
        start += n


@pytest.mark.parametrize("kv_lens", [[5, 1, 30, 17], [8, 8, 8]])
def test_decode_equals_per_request(tiny_spec, decode_plan, attention_alone, kv_lens):
    gen = torch.Generator().manual_seed(1)
    b, s = len(kv_lens), max(kv_lens)
    q = sharp((b, 4, 24), gen)
    # Garbage past each row's length: the block mask must hide it.
    k, v = sharp((b, 2, s, 24), gen, 50.0), sharp((b, 2, s, 24), gen, 50.0)
    out = flex(tiny_spec).decode(q, k, v, decode_plan(kv_lens))
    assert out.shape == (b, 96)
    for i, n in enumerate(kv_lens):
        expected = attention_alone(q[i][:, None], k[i, :, :n], v[i, :, :n], False)
        assert torch.allclose(out[i], expected[0], atol=1e-4, rtol=1e-5), i


def test_gqa_head_mapping(tiny_spec, prefill_batch, decode_plan):
    """4 heads over 2 kv heads: heads 0,1 read kv head 0 and heads 2,3 kv head 1."""
    t = 3
    q, k = torch.zeros(t, 4, 24), torch.zeros(t, 2, 24)
    v = torch.stack([torch.full((t, 24), 2.0), torch.full((t, 24), -3.0)], dim=1)
    out = flex(tiny_spec).prefill(q, k, v, prefill_batch([t])).view(t, 4, 24)
    assert torch.allclose(out[:, :, 0], torch.tensor([2.0, 2.0, -3.0, -3.0]).expand(t, 4))
    kd, vd = k.transpose(0, 1)[None], v.transpose(0, 1)[None]  # [1, kv_heads, t, d]
    out = flex(tiny_spec).decode(torch.zeros(1, 4, 24), kd, vd, decode_plan([t])).view(4, 24)
    assert torch.allclose(out[:, 0], torch.tensor([2.0, 2.0, -3.0, -3.0]))


def test_mask_is_built_once_per_call(tiny_spec, prefill_batch, monkeypatch):
    """Every layer of a call passes the same batch object; a new call gets a new mask."""
    import variants.attention.flex as flex_module

    built = []
    real = flex_module.create_block_mask
    monkeypatch.setattr(
        flex_module, "create_block_mask", lambda *a, **kw: built.append(1) or real(*a, **kw)
    )
    attention, gen = flex(tiny_spec), torch.Generator().manual_seed(3)
    q, k, v = sharp((8, 4, 24), gen), sharp((8, 2, 24), gen), sharp((8, 2, 24), gen)
    batch = prefill_batch([5, 3])
    first = attention.prefill(q, k, v, batch)
    assert torch.equal(attention.prefill(q, k, v, batch), first) and len(built) == 1
    attention.prefill(q, k, v, prefill_batch([5, 3]))
    assert len(built) == 2


@pytest.fixture(scope="module")
def script_and_expected(tiny_config, sharp_weights):
    """The calls and, per call, the reference's last-token logits of each id over its history."""
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    gen = torch.Generator().manual_seed(5)
    vocab = tiny_config["vocab_size"]
    calls, expected, history = [], [], {}
    for op, ids, lengths in SCRIPT:
        if op == "remove":
            calls.append((op, ids, None))
            expected.append(None)
            for rid in ids:
                del history[rid]
            continue
        if op == "prefill":
            tokens = [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]
            history.update(zip(ids, tokens))
        else:
            tokens = torch.randint(0, vocab, (len(ids),), generator=gen)
            for rid, t in zip(ids, tokens):
                history[rid] = torch.cat([history[rid], t[None]])
        calls.append((op, ids, tokens))
        expected.append(torch.stack([ref.forward(history[r][None])[0, -1] for r in ids]))
    return calls, expected


def check_script(engine, script_and_expected):
    for step, ((op, ids, tokens), want) in enumerate(zip(*script_and_expected)):
        out = getattr(engine, op)(ids, *([] if tokens is None else [tokens]))
        if want is None:
            assert not set(ids) & set(engine.lengths)
            continue
        assert out.shape == (len(ids), 256) and out.dtype == torch.float32
        err = (out - want).abs().max().item()
        assert err < TOL, f"step {step} {op} {ids}: max |d| {err:.3g}"
    assert engine.lengths == {A: 8, B: 4, C: 45}


@pytest.mark.parametrize(
    "variant",
    [Variant(attention="flex", cache=c) for c in ("contiguous", "slab", "paged")],
    ids=lambda v: v.name,
)
def test_engine_matches_the_reference(tiny_config, sharp_weights, script_and_expected, variant):
    engine = build_engine(tiny_config, sharp_weights, "cpu", variant)
    assert type(engine.model.attention).__name__ == "FlexAttention"
    check_script(engine, script_and_expected)


def test_rendered_engine_matches_the_reference(
    tmp_path, tiny_config, sharp_weights, script_and_expected
):
    path = render_engine(Variant(attention="flex", cache="paged"), tmp_path / "engine.py")
    source = path.read_text()
    assert "class FlexAttention" in source and "class SdpaAttention" not in source
    spec = importlib.util.spec_from_file_location("flex_engine", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    engine = module.create_engine(tiny_config, sharp_weights, "cpu")
    assert type(engine.model.attention).__name__ == "FlexAttention"
    check_script(engine, script_and_expected)
