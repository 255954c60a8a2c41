"""scripts/step_kernels.py: a setting's overrides per kernel, and which projection a few-row
linear launch is (the launchers themselves run on the GPU only, in the step graph)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

step_kernels = pytest.importorskip("scripts.step_kernels")


def test_a_setting_parses_into_tiles_and_splits_per_kernel():
    assert step_kernels.parse("default") == {}
    assert step_kernels.parse("o:-/4+gateup:16,64,4,4") == {
        "o": {"tiles": None, "split_k": 4},
        "gateup": {"tiles": (16, 64, 4, 4), "split_k": None},
    }


def test_a_setting_may_force_the_staged_weight_on_or_off():
    assert step_kernels.parse("o:32,128,4,3/2@on+down:-@off") == {
        "o": {"tiles": (32, 128, 4, 3), "split_k": 2, "stage": True},
        "down": {"tiles": None, "split_k": None, "stage": False},
    }
    with pytest.raises(ValueError, match="'maybe'"):
        step_kernels.parse("o:-@maybe")


def test_an_unknown_kernel_is_named():
    with pytest.raises(ValueError, match="'proj'"):
        step_kernels.parse("proj:-/2")


def test_linear_launches_are_told_apart_by_shape_and_norm():
    o, down = torch.empty(768, 768), torch.empty(768, 3072)
    assert step_kernels._linear_kind(o, None) == "o"
    assert step_kernels._linear_kind(down, None) == "down"
    assert step_kernels._linear_kind(torch.empty(4096, 768), torch.empty(768)) == "head"


def test_use_routes_and_restores_the_fused_stack(monkeypatch):
    fused = step_kernels.fused_stack
    for name in step_kernels.ORIGINAL:  # the module's launchers come back after the test
        monkeypatch.setattr(fused, name, getattr(fused, name))
    seen = []
    monkeypatch.setitem(
        step_kernels.ORIGINAL, "norm_swiglu", lambda *a, **k: seen.append(k) or "out"
    )
    try:
        step_kernels.use("gateup:16,64,4,4/2")
        assert fused.norm_swiglu(1, 2, pdl=True) == "out"
        assert seen == [{"pdl": True, "tiles": (16, 64, 4, 4), "split_k": 2}]
    finally:
        step_kernels.use("default")
    assert fused.norm_swiglu is step_kernels.ORIGINAL["norm_swiglu"]
