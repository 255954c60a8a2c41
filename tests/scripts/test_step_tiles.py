"""scripts/step_tiles.py: a setting's forced launch arguments, and routing the engine's
decode attention through them and back (the step graphs themselves run on the GPU only)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

step_tiles = pytest.importorskip("scripts.step_tiles")


def test_a_setting_forces_the_fields_it_names():
    assert step_tiles.parse("default") == {}
    assert step_tiles.parse("32:32,4,2") == {"split_tokens": 32, "tiles": (32, 4, 2)}
    assert step_tiles.parse("-:-:128,64") == {"parts": (128, 64)}
    assert step_tiles.parse("-:16,2,3:-:1") == {"tiles": (16, 2, 3), "prefetch_tiles": 1}


def test_a_setting_with_too_many_fields_is_named():
    with pytest.raises(ValueError, match="'1:2:3:4:5'"):
        step_tiles.parse("1:2:3:4:5")


def test_use_routes_and_restores_the_attention(monkeypatch):
    attention = step_tiles.triton_attention
    monkeypatch.setattr(attention, "paged_decode_attention", step_tiles.DEFAULT)
    seen = []
    monkeypatch.setattr(step_tiles, "DEFAULT", lambda *a, **k: seen.append(k))
    step_tiles.use("-:-:128,64:1")
    attention.paged_decode_attention("q", pdl=True)
    assert seen == [{"parts": (128, 64), "prefetch_tiles": 1, "pdl": True}]
    step_tiles.use("default")
    assert attention.paged_decode_attention is step_tiles.DEFAULT
