"""Trace definitions: the public numbers, the stress properties, serving sizes, validity."""

import json
from pathlib import Path

import pytest
import torch

from evaluator.benchmark_traces import (
    SUITES,
    get_trace,
    hidden_like,
    public_benchmarks,
    serving_suite,
)
from evaluator.correctness_traces import LARGE_ID_BASE, public_correctness, stress
from evaluator.traces import Decode, Prefill, Remove, Trace, materialize, replay, validate

PUBLIC_CONFIG = json.loads(
    (Path(__file__).resolve().parents[2] / "target" / "model_config.json").read_text()
)


@pytest.fixture(params=["tiny", "public"])
def config(request, tiny_config):
    return tiny_config if request.param == "tiny" else PUBLIC_CONFIG


def all_traces(config):
    traces = [public_correctness(), stress(config, 0), stress(config, 1)]
    for make in SUITES.values():
        traces.extend(make(config))
    return traces


def test_public_correctness_is_the_contract_sequence():
    assert public_correctness().ops == (
        Prefill((0,), (11,)),
        Decode((0,)),
        Prefill((1, 2), (7, 13)),
        Decode((0, 1, 2)),
        Remove((1,)),
        Prefill((3,), (5,)),
        Decode((0, 2, 3)),
        Remove((0, 2, 3)),
    )


def test_public_benchmark_token_counts():
    prefill, decode, mixed = public_benchmarks()
    assert (prefill.name, prefill.prefill_tokens, prefill.decode_tokens) == ("prefill", 512, 0)
    assert (decode.name, decode.prefill_tokens, decode.decode_tokens) == ("decode", 256, 128)
    # 4x64 + 2x128 + 4x32 prompts; decodes of 4 + 4 + 6 + 8 + 8 rows.
    assert (mixed.name, mixed.prefill_tokens, mixed.decode_tokens) == ("mixed", 640, 30)


def test_hidden_like_token_counts():
    decode, mixed = hidden_like()
    assert (decode.prefill_tokens, decode.decode_tokens) == (1024, 128)
    assert (mixed.prefill_tokens, mixed.decode_tokens) == (1280, 30)


def test_mixed_schedule_takes_the_lowest_live_ids():
    mixed = public_benchmarks()[2]
    assert [(type(op).__name__, op.ids) for op in mixed.ops] == [
        ("Prefill", (0, 1, 2, 3)),
        ("Decode", (0, 1, 2, 3)),
        ("Decode", (0, 1, 2, 3)),
        ("Prefill", (4, 5)),
        ("Decode", (0, 1, 2, 3, 4, 5)),
        ("Remove", (0, 1)),
        ("Prefill", (6, 7, 8, 9)),
        ("Decode", (2, 3, 4, 5, 6, 7, 8, 9)),
        ("Decode", (2, 3, 4, 5, 6, 7, 8, 9)),
        ("Remove", (2, 3, 4, 5, 6, 7, 8, 9)),
    ]
    assert [op.lengths for op in mixed.ops if isinstance(op, Prefill)] == [
        (64,) * 4,
        (128,) * 2,
        (32,) * 4,
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stress_properties(config, seed):
    max_pos = config["max_position_embeddings"]
    trace = validate(stress(config, seed), max_pos)
    assert trace == stress(config, seed)  # deterministic
    ids = [i for op in trace.ops for i in op.ids]
    assert min(ids) >= LARGE_ID_BASE
    assert any(list(op.ids) != sorted(op.ids) for op in trace.ops)
    assert max(len(op.ids) for op in trace.ops if isinstance(op, Prefill)) >= 32
    assert max(len(op.ids) for op in trace.ops if isinstance(op, Decode)) >= 32
    prompts = [n for op in trace.ops if isinstance(op, Prefill) for n in op.lengths]
    assert min(prompts) == 1 and max(prompts) >= 200
    assert max_pos - 8 <= max(prompts) < max_pos

    live, reprefilled, longest = set(), 0, 0
    for op, lengths in replay(trace):
        if isinstance(op, Prefill):
            reprefilled += len(live & set(op.ids))
        if isinstance(op, Remove):
            live -= set(op.ids)
        else:
            live |= set(op.ids)
            longest = max(longest, *lengths)
    assert reprefilled >= 1
    assert longest == max_pos  # decodes reach exactly the limit, never beyond (validate)


def test_serving_sizes(config):
    max_pos = config["max_position_embeddings"]
    traces = {t.name: t for t in serving_suite(config)}
    cont = traces["continuous"]
    assert cont.num_requests >= 100
    prompts = [n for op in cont.ops if isinstance(op, Prefill) for n in op.lengths]
    assert min(prompts) >= min(16, max_pos) and max(prompts) <= min(1024, max_pos)
    assert max(prompts) > 256  # the range is really used
    live, most_live, outputs = set(), 0, {}
    for op in cont.ops:
        if isinstance(op, Remove):
            live -= set(op.ids)
        else:
            live |= set(op.ids)
        if isinstance(op, Decode):
            for i in op.ids:
                outputs[i] = outputs.get(i, 0) + 1
        most_live = max(most_live, len(live))
    assert most_live == 32
    assert 8 <= min(outputs.values()) and max(outputs.values()) <= 256
    assert not live

    wide = traces["wide_decode"]
    assert len(wide.ops[0].ids) == 64 and len(wide.ops[1].ids) == 64
    assert "long_prompts" in traces if max_pos >= 4096 else "long_prompts" not in traces
    if max_pos >= 4096:
        assert wide.prefill_tokens == 64 * 256 and wide.decode_tokens == 64 * 128
        assert traces["long_prompts"].ops[0].lengths == (2048,) * 4


def test_every_trace_is_valid_and_ends_empty(config):
    for trace in all_traces(config):
        validate(trace, config["max_position_embeddings"])
        live = set()
        for op in trace.ops:
            live = live - set(op.ids) if isinstance(op, Remove) else live | set(op.ids)
        assert not live, trace.name


@pytest.mark.parametrize(
    "ops, message",
    [
        ([Prefill([0], [4]), Decode([1])], "not live"),
        ([Prefill([0], [4]), Remove([0]), Decode([0])], "not live"),
        ([Prefill([0], [8]), Decode([0])], "max positions 8"),
        ([Prefill([0, 0], [2, 3])], "duplicate"),
        ([Prefill([0], [0])], "empty prompt"),
    ],
)
def test_validate_rejects_bad_traces(ops, message):
    with pytest.raises(ValueError, match=message):
        validate(Trace("bad", ops), max_positions=8)


def test_materialize_is_deterministic_per_seed():
    trace = public_correctness()
    a = materialize(trace, 100, "cpu", seed=7)
    b = materialize(trace, 100, "cpu", seed=7)
    c = materialize(trace, 100, "cpu", seed=8)
    assert [call[0] for call in a] == ["prefill", "decode"] * 2 + ["remove", "prefill"] + [
        "decode",
        "remove",
    ]
    assert [len(t) for t in a[2][2]] == [7, 13]
    assert a[3][2].shape == (3,) and a[3][2].dtype == torch.long
    for x, y in zip(a, b, strict=True):
        assert x[:2] == y[:2]
        if x[0] == "prefill":
            assert all(torch.equal(p, q) for p, q in zip(x[2], y[2], strict=True))
        elif x[0] == "decode":
            assert torch.equal(x[2], y[2])
    assert not torch.equal(a[0][2][0], c[0][2][0])
    tokens = torch.cat([t for call in a if call[0] == "prefill" for t in call[2]])
    assert tokens.min() >= 0 and tokens.max() < 100


def test_get_trace_by_name(tiny_config):
    assert get_trace("mixed", tiny_config) == public_benchmarks()[2]
    assert get_trace("stress", tiny_config) == stress(tiny_config, 0)
    assert get_trace("mixed_128", tiny_config).prefill_tokens == 1280
    with pytest.raises(KeyError, match="unknown trace"):
        get_trace("nope", tiny_config)
    assert set(SUITES) == {"public", "hidden", "serving"}
