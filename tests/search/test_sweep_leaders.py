"""The shape sweep after the search: its time limit follows what is left of the budget, and a
fuller sweep of the same variants is not replaced by it."""

import json

from search.setup import sweep_reserve_s
from search.sweep_command import _kept_sweep, sweep_limit


def test_a_gpu_sweep_gets_what_is_left_within_20_to_90_s():
    assert sweep_limit("cuda", 500.0) == 90.0
    assert sweep_limit("cuda", 78.0) == 45.0  # its builds (28 s) and the wrap-up (5 s) after
    assert sweep_limit("cuda", 3.0) == 20.0  # the figures need a few shapes
    assert sweep_limit("cuda", -30.0) == 20.0  # already over the budget


def test_the_trials_leave_a_gpu_sweep_a_tenth_of_the_budget_within_its_bounds():
    assert sweep_reserve_s("cuda", 1200.0) == 90.0  # the default 20 minutes: its limit
    assert sweep_reserve_s("cuda", 600.0) == 60.0
    assert sweep_reserve_s("cuda", 240.0) == 48.0  # 4 minutes: its least (20 s and the builds)
    assert sweep_reserve_s("cpu", 240.0) == 10.0


def test_a_cpu_sweep_gets_what_is_left_up_to_10_s_or_none():
    assert sweep_limit("cpu", 500.0) == 10.0
    assert sweep_limit("cpu", 16.0) == 6.0  # its start (5 s) and the wrap-up (5 s) after
    assert sweep_limit("cpu", 11.0) is None  # under 2 s of shapes: not run
    assert sweep_limit("cpu", -30.0) is None  # already over the budget


def test_a_full_sweep_of_the_same_variants_stays_and_a_cut_one_is_swept_again(tmp_path):
    a, b = {"cache": "slab"}, {"cache": "paged"}
    path = tmp_path / "sweep.json"

    def write(skipped, device="cpu", error=None):
        entry = {"variant": a, "skipped": skipped, **({"error": error} if error else {})}
        path.write_text(json.dumps({"device": device, "variants": [entry, {"variant": b}]}))

    write([])  # a `sweep` command's: every shape measured
    assert _kept_sweep(path, [a, b], "cpu", reuse=False) == (
        "same variants, same device, every shape measured"
    )
    write([{"kind": "decode", "batch": 64, "why": "out of memory"}])  # (not a cut)
    assert _kept_sweep(path, [a, b], "cpu", reuse=False) is not None
    write([{"kind": "prefill", "length": 2048, "why": "time limit"}])  # a run's, cut short
    assert _kept_sweep(path, [a, b], "cpu", reuse=False) is None
    assert _kept_sweep(path, [a, b], "cpu", reuse=True) == "same variants, same device"
    write([])
    assert _kept_sweep(path, [b, a], "cpu", reuse=True) is None  # other leaders
    assert _kept_sweep(path, [a, b], "cuda:0", reuse=True) is None  # another device
    write([], error="RuntimeError")
    assert _kept_sweep(path, [a, b], "cpu", reuse=True) is None
    path.write_text("{not json")
    assert _kept_sweep(path, [a, b], "cpu", reuse=True) is None
    assert _kept_sweep(tmp_path / "none.json", [a, b], "cpu", reuse=True) is None
