"""The floor model against hand-computed costs, and measured ceilings."""

import math

import pytest

from evaluator.floor import (
    Ceilings,
    CostModel,
    call_costs,
    floor_efficiency,
    measure_ceilings,
    trace_floor_seconds,
)
from evaluator.toy_weights import make_toy_weights
from evaluator.traces import Decode, Prefill, Remove, Trace

# H=4, I=8, V=10, 1 layer, 2 heads of 2, 1 kv head.
HAND = {
    "vocab_size": 10,
    "hidden_size": 4,
    "intermediate_size": 8,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 2,
    "max_position_embeddings": 16,
}
TRACE = Trace("hand", (Prefill([0], [3]), Decode([0]), Remove([0])))


def test_hand_computed_costs():
    # Matmul params: q 4*4 + k,v 2*(4*2) + o 4*4 + gate,up,down 3*4*8 = 144.
    # Weight bytes (fp16): (144 + two norms 8) + final norm 4 + lm_head 40 = 196 elements.
    # Prefill of 3: 2*144*3 + attention 4*1*2*2 per pair * 6 causal pairs + lm_head 2*4*10
    #   = 864 + 96 + 80 FLOPs; bytes 392 + 3 * (embedding row 8 + K/V 2*1*2*2 = 8).
    # Decode at context 4: 2*144 + 16*4 + 80 FLOPs; bytes 392 + 8 + 4*8.
    assert call_costs(TRACE, HAND, dtype_bytes=2) == [(1040, 440), (432, 432)]
    # 1 FLOP/s and 1 byte/s: each call takes the larger count, in seconds.
    assert trace_floor_seconds(TRACE, HAND, Ceilings(1e-9, 1e-12)) == pytest.approx(1040 + 432)
    # 10 FLOP/s: both calls are bandwidth bound.
    assert trace_floor_seconds(TRACE, HAND, Ceilings(1e-9, 1e-11)) == pytest.approx(440 + 432)


def test_weight_bytes_match_the_real_weights(tiny_config):
    weights = make_toy_weights(tiny_config)
    numel = sum(w.numel() for name, w in weights.items() if name != "embed_tokens.weight")
    assert CostModel.from_config(tiny_config, 2).weight_bytes == 2 * numel
    assert CostModel.from_config(tiny_config, 4).weight_bytes == 4 * numel


def test_measured_cpu_ceilings_are_plausible():
    measured = measure_ceilings("cpu")
    assert 0.1 < measured.bandwidth_gbs < 10_000 and 1e-4 < measured.tflops < 1_000
    assert "measured on cpu" in measured.source
    given = measure_ceilings("cpu", bandwidth_gbs=936.0, tflops=71.0)
    assert given == Ceilings(936.0, 71.0, "given")


def test_efficiency_of_a_plausible_engine_is_a_fraction():
    # An engine doing the hand trace in 2000 s at 1 FLOP/s and 1 byte/s is at 1472 / 2000.
    floor_s = trace_floor_seconds(TRACE, HAND, Ceilings(1e-9, 1e-12))
    assert floor_efficiency(floor_s, 2000.0) == pytest.approx(0.736)
    assert math.isfinite(floor_s)


def test_an_efficiency_over_one_is_no_efficiency():
    """Faster than the floor means the ceilings were measured too low: nothing is printed."""
    assert floor_efficiency(1.0, 1.0) == 1.0
    assert floor_efficiency(1.9, 1.0) is None
