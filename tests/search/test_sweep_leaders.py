"""The shape sweep after the search: its time limit follows what is left of the budget."""

from sweep.command import sweep_limit


def test_a_gpu_sweep_gets_what_is_left_within_20_to_90_s():
    assert sweep_limit("cuda", 500.0) == 90.0
    assert sweep_limit("cuda", 45.0) == 45.0
    assert sweep_limit("cuda", 3.0) == 20.0  # the figures need a few shapes
    assert sweep_limit("cuda", -30.0) == 20.0  # already over the budget


def test_a_cpu_sweep_always_gets_10_s():
    assert sweep_limit("cpu", 500.0) == 10.0
    assert sweep_limit("cpu", -30.0) == 10.0
