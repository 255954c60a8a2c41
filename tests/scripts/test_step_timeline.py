"""scripts/step_timeline.py: naming a profiled kernel's kind, cutting one replay out of
back-to-back replays, and the per-kind sums (the GPU capture itself runs on the device)."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

step_timeline = pytest.importorskip("scripts.step_timeline")


def _event(name, start, end):
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end))


def test_kernels_are_named_by_kind():
    assert step_timeline.kernel_kind("_decode_split_kernel") == "decode attention"
    assert step_timeline.kernel_kind("nvjet_sm90_hsh_64x8_64x16_4x1_v_bz_TNT") == "gemm"
    assert step_timeline.kernel_kind("_norm_swiglu_kernel") == "norm + gate-up + SiLU-mul"
    long_name = "void at::native::vectorized_gather_kernel<16, long>(char*, char*)"
    assert step_timeline.kernel_kind(long_name) == long_name[:40]


def test_overlapping_kernels_sum_to_the_replay():
    rows = [("a", 0.0, 8.0), ("b", 1.0, 20.0), ("a", 9.0, 25.0), ("c", 24.0, 30.0)]
    kinds = step_timeline.summarize(rows)
    assert kinds["a"] == {"count": 2, "span_us": 24.0, "to_next_us": 16.0}  # 1 + 15
    assert kinds["b"] == {"count": 1, "span_us": 19.0, "to_next_us": 8.0}
    assert kinds["c"] == {"count": 1, "span_us": 6.0, "to_next_us": 6.0}  # the last: its end
    assert sum(k["to_next_us"] for k in kinds.values()) == 30.0  # the replay, first to last


def test_one_replay_is_cut_out_and_starts_at_zero():
    per_replay = [("_few_row_linear_kernel", 0, 5), ("_decode_split_kernel", 2, 9)]
    events = [_event(n, 100 * r + s, 100 * r + e) for r in range(3) for n, s, e in per_replay]
    events.reverse()  # the profiler's order is not the start order
    rows = step_timeline.one_replay(events, 3, 1)
    assert rows == [("few-row projection", 0, 5), ("decode attention", 2, 9)]
