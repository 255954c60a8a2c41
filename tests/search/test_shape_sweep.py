"""The shape sweep on real engines of the tiny model on the CPU: every shape, every variant."""

import json
import math

import pytest

from sweep.measure import decode_context, prefill_lengths, sweep
from variants.presets import PRESETS
from variants.variant import Variant

PAGED = Variant(cache="paged", block_size=64)
CEILINGS = {"bandwidth_gbs": 10.0, "tflops": 0.1, "source": "given"}


@pytest.fixture(scope="module")
def result(tiny_config, tiny_weights):
    variants = [("slab-sdpa", PRESETS["slab-sdpa"]), ("paged", PAGED)]
    return sweep(
        tiny_config, tiny_weights, "cpu", variants, batches=(1, 3), context=600,
        lengths=(16, 600), decode_repeats=2, prefill_repeats=2, warmup=1, ceilings=CEILINGS,
    )  # fmt: skip


def positive(value) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


def test_every_shape_of_every_variant_has_positive_finite_numbers(result, tiny_config):
    assert {"device", "torch", "gpu", "date", "settings", "floor", "variants"} <= set(result)
    assert result["device"] == "cpu" and result["gpu"] is None
    json.dumps(result)  # JSON-able as it is
    limit = tiny_config["max_position_embeddings"]
    context = limit - 2 + 1  # capped: the last of 2 timed steps ends at max_position_embeddings
    assert result["settings"]["context"] == context
    assert result["settings"]["lengths"] == [16, limit]  # 600 capped at 512
    names = [v["name"] for v in result["variants"]]
    assert names == ["slab-sdpa", "paged"]
    assert result["variants"][1]["variant"] == PAGED.to_dict()  # measured apart, not merged
    for v in result["variants"]:
        assert "error" not in v and v["skipped"] == []
        assert [p["batch"] for p in v["decode"]] == [1, 3]
        for p in v["decode"]:
            assert set(p) == {"batch", "context", "step_ms", "min_ms", "tokens_per_s", "floor_ms"}
            assert p["context"] == context
            assert all(positive(p[k]) for k in ("step_ms", "min_ms", "tokens_per_s", "floor_ms"))
            assert p["floor_ms"] < p["step_ms"]
        assert [p["length"] for p in v["prefill"]] == [16, limit]
        for p in v["prefill"]:
            assert set(p) == {"length", "seconds", "tokens_per_s", "floor_tokens_per_s"}
            assert all(positive(p[k]) for k in ("seconds", "tokens_per_s", "floor_tokens_per_s"))
            assert p["tokens_per_s"] == pytest.approx(p["length"] / p["seconds"])
    assert result["floor"]["ceilings"] == CEILINGS


def test_context_and_lengths_stay_within_the_model():
    config = {"max_position_embeddings": 64}
    assert decode_context(config, 256, warmup=3, repeats=20) == 64 - 20 + 1
    assert decode_context(config, 32, warmup=3, repeats=20) == 32
    assert decode_context(config, 1, warmup=3, repeats=2) == 5  # the prompt is never empty
    assert prefill_lengths(config, (128, 16, 64, 4096)) == [16, 64]


def test_a_spent_time_limit_keeps_the_first_shape_and_builds_no_further_engine(
    tiny_config, tiny_weights
):
    variants = [("slab-sdpa", PRESETS["slab-sdpa"]), ("paged", PAGED)]
    out = sweep(
        tiny_config, tiny_weights, "cpu", variants, batches=(1, 2), context=32, lengths=(8, 16),
        decode_repeats=1, prefill_repeats=1, warmup=1, time_limit_s=0.0, floor=False,
    )  # fmt: skip
    first, second = out["variants"]
    assert [p["batch"] for p in first["decode"]] == [1]
    assert [p["length"] for p in first["prefill"]] == [8]
    assert {(s["kind"], s["why"]) for s in first["skipped"]} == {
        ("decode", "time limit"),
        ("prefill", "time limit"),
    }
    assert second["decode"] == [] and second["skipped"] == [{"kind": "engine", "why": "time limit"}]
    assert out["floor"] is None and first["decode"][0]["floor_ms"] is None


def test_an_engine_that_fails_is_recorded_and_the_sweep_goes_on(tiny_config, tiny_weights):
    from variants.build import build_engine

    def build(config, weight_dir, device, variant):
        if variant.cache == "paged":
            raise RuntimeError("planted build failure")
        return build_engine(config, weight_dir, device, variant)

    variants = [("paged", PAGED), ("slab-sdpa", PRESETS["slab-sdpa"])]
    out = sweep(
        tiny_config, tiny_weights, "cpu", variants, batches=(1,), context=16, lengths=(8,),
        decode_repeats=1, prefill_repeats=1, warmup=1, floor=False, build=build,
    )  # fmt: skip
    failed, ok = out["variants"]
    assert failed["error"] == "RuntimeError: planted build failure" and failed["decode"] == []
    assert "error" not in ok and len(ok["decode"]) == 1 and len(ok["prefill"]) == 1
