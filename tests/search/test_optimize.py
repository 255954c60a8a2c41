"""The search loop's budget: what it keeps in reserve for the phases after the trials."""

import time

import pytest

from search.study import Budget


def budget(total_s: float, trial_timeout_s: float = 1000.0, **kw) -> Budget:
    return Budget(time.monotonic() + total_s, trial_timeout_s, total_s=total_s, **kw)


def test_the_reserve_is_four_typical_trials_and_the_sweep():
    b = budget(1200.0, trial_timeout_s=300.0, after_s=90.0)
    # typical trial 20 s: 80 s for the re-measure and verification, 90 s for the sweep
    assert b.time_for_trial([20.0, 19.0, 21.0]) == 300.0  # the trial limit, far from the end
    b = budget(600.0, after_s=90.0)  # 35 % of 600 s is 210 s: the whole 170 s is kept
    assert b.time_for_trial([20.0]) == pytest.approx(600.0 - 170.0, abs=1.0)
    assert budget(600.0).time_for_trial([20.0]) == pytest.approx(600.0 - 80.0, abs=1.0)


def test_the_reserve_never_takes_more_than_its_share_of_a_short_budget():
    b = budget(240.0, after_s=90.0)  # 4 x 20 + 90 = 170 s wanted, 35 % of 240 s = 84 s kept
    assert b.time_for_trial([20.0]) == pytest.approx(240.0 - 84.0, abs=1.0)


def test_no_trial_when_less_than_three_quarters_of_one_is_left():
    b = budget(100.0, after_s=90.0)  # the reserve is 35 s; 65 s left
    assert b.time_for_trial([90.0]) is None
    assert b.time_for_trial([60.0]) == pytest.approx(65.0, abs=1.0)


def test_the_kernel_search_keeps_its_share_beyond_the_capped_reserve():
    # a 5-minute budget: the trials' reserve is capped at 35 % (105 s); the kernel search's 30 s
    # and the leader's three typical timings (60 s) are kept on top of it
    b = budget(300.0, after_s=90.0, kept_s=30.0, kept_trials=3.0)
    assert b.time_for_trial([20.0]) == pytest.approx(300.0 - 105.0 - 30.0 - 60.0, abs=1.0)
    assert budget(300.0, after_s=90.0).time_for_trial([20.0]) == pytest.approx(195.0, abs=1.0)
