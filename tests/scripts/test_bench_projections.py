"""scripts/bench_projections.py: the projection shapes it times and each chain's calls (the
timing itself runs on the device)."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

bench = pytest.importorskip("scripts.bench_projections")


def test_the_public_models_projection_shapes():
    config = json.loads((ROOT / "target/model_config.json").read_text())
    assert bench.projection_shapes(config) == {
        "qkv": (2304, 768), "output": (768, 768), "gate-up": (6144, 768), "down": (768, 3072),
    }  # fmt: skip


def test_grouped_query_shapes():
    config = dict(hidden_size=64, intermediate_size=96, head_dim=16, num_attention_heads=4,
                  num_key_value_heads=2)  # fmt: skip
    assert bench.projection_shapes(config) == {
        "qkv": (128, 64), "output": (64, 64), "gate-up": (192, 64), "down": (64, 96),
    }  # fmt: skip


def test_a_chain_runs_x_through_every_weight_copy():
    calls = bench.chain(lambda x, w: x + w, 1, [10, 20, 30])
    assert [call() for call in calls] == [11, 21, 31]
