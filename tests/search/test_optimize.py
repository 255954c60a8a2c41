"""The search loop's budget: what it keeps in reserve for the phases after the trials."""

import time

import pytest

from search.cli import launched_s_ago
from search.study import Budget


def budget(total_s: float, trial_timeout_s: float = 1000.0, **kw) -> Budget:
    return Budget(time.monotonic() + total_s, trial_timeout_s, total_s=total_s, **kw)


def test_the_reserve_is_the_leaders_the_verification_and_the_sweep():
    b = budget(1200.0, trial_timeout_s=300.0, leader_trials=4.5, verify_trials=3.0, after_s=90.0)
    # typical trial 20 s: 90 s for three leaders' full protocol, 60 s for the verification (three
    # trials until the study has measured one), 90 s for the sweep
    assert b.time_for_trial([20.0, 19.0, 21.0]) == 300.0  # the trial limit, far from the end
    b = budget(
        1000.0, leader_trials=4.5, verify_trials=3.0, after_s=90.0
    )  # 35 % is 350 s: 240 s kept
    assert b.time_for_trial([20.0]) == pytest.approx(1000.0 - 240.0, abs=1.0)
    b = budget(
        1000.0, leader_trials=4.5, verify_trials=3.0, verify_s=100.0
    )  # as the study measured it
    assert b.time_for_trial([20.0]) == pytest.approx(1000.0 - 190.0, abs=1.0)
    assert budget(600.0).time_for_trial([20.0]) == pytest.approx(600.0, abs=1.0)  # a worker's


def test_the_reserve_never_takes_more_than_its_share_of_a_short_budget():
    b = budget(240.0, leader_trials=4.5, verify_trials=3.0, after_s=15.0)
    assert b.time_for_trial([20.0]) == pytest.approx(240.0 - 84.0, abs=1.0)  # 165 s wanted
    # ... but never less than the verification and the sweep, which no run goes without:
    # 3 x 30 + 15 s, the leaders' full-protocol runs dropped
    assert b.time_for_trial([30.0]) == pytest.approx(240.0 - 105.0, abs=1.0)
    # a model whose trial takes a minute on a 5-minute budget: after the first trial, what is
    # left is the verification's (3 minutes) and the sweep's
    b = budget(300.0 - 62.0, leader_trials=4.5, verify_trials=3.0, after_s=15.0)
    b.total_s = 300.0
    assert b.time_for_trial([60.0]) is None


def test_no_trial_when_less_than_three_quarters_of_one_is_left():
    b = budget(100.0, after_s=30.0)  # the reserve is the sweep's 30 s; 70 s left
    assert b.time_for_trial([100.0]) is None
    assert b.time_for_trial([60.0]) == pytest.approx(70.0, abs=1.0)


def test_the_kernel_search_keeps_its_share_beyond_the_capped_reserve():
    # a 5-minute budget: the trials' reserve is capped at 35 % (105 s); the kernel search's 30 s
    # and the leader's three typical timings (60 s) are kept on top of it
    b = budget(
        300.0, leader_trials=4.5, verify_trials=3.0, after_s=15.0, kept_s=30.0, kept_trials=3.0
    )
    assert b.time_for_trial([20.0]) == pytest.approx(300.0 - 105.0 - 30.0 - 60.0, abs=1.0)
    b = budget(300.0, leader_trials=4.5, verify_trials=3.0, after_s=15.0)
    assert b.time_for_trial([20.0]) == pytest.approx(195.0, abs=1.0)


def test_the_first_trials_come_before_the_kernel_search_s_reserve():
    # a GPU's 4-minute run, 182 s left after its warm-up: the verification, the sweep and the
    # kernel search's share with its leader's timings (209 s) left no trial; the search needs a
    # leader, so its time is kept from the third timed trial on
    kw = dict(leader_trials=3.0, verify_trials=1.5, after_s=95.0, kept_s=24.0, kept_trials=3.0)
    b = budget(182.0, kept_after=3, **kw)
    b.total_s = 240.0
    assert b.time_for_trial([]) == pytest.approx(182.0 - 125.0, abs=1.0)
    assert b.time_for_trial([23.0, 23.0]) is not None
    assert b.time_for_trial([23.0, 23.0, 23.0]) is None  # 182 s left: 129.5 + 24 + 69 kept
    b = budget(182.0, **kw)  # (kept from the start: no trial at all)
    b.total_s = 240.0
    assert b.time_for_trial([]) is None


def test_the_kernel_search_keeps_two_contenders_only_where_both_fit_a_share_of_the_budget():
    """Each contender's share and its timings; two where both fit in KERNEL_RESERVE_SHARE of
    the budget (a 20-minute run of the 1B model: 2 x (120 s + 4 trials of 13 s) = 344 s of
    1,200), else one (a 5-minute one: 2 x (30 s + 52 s) of 300)."""
    from search.setup import KERNEL_RESERVE_SHARE, Budget

    kw = dict(kept_trials=4.0, kept_contenders=2)
    long = Budget(0.0, 300.0, total_s=1200.0, kept_s=120.0, **kw)
    assert long.contenders([13.0]) == 2 and long.kept_reserve_s([13.0]) == pytest.approx(344.0)
    assert 344.0 <= KERNEL_RESERVE_SHARE * 1200.0
    short = Budget(0.0, 300.0, total_s=300.0, kept_s=30.0, **kw)
    assert short.contenders([13.0]) == 1 and short.kept_reserve_s([13.0]) == pytest.approx(82.0)
    assert Budget(0.0, 300.0, total_s=1200.0, kept_s=120.0, kept_trials=4.0).contenders([]) == 1


def test_the_budget_counts_from_run_sh_s_start(monkeypatch):
    monkeypatch.setenv("AUTOTUNER_STARTED_AT", str(time.time() - 30.0))
    assert launched_s_ago() == pytest.approx(30.0, abs=1.0)
    # not set, not a time, in the future or long past (a stale export): the process's own start
    for stamp in ("", "soon", str(time.time() + 60.0), str(time.time() - 3600.0)):
        monkeypatch.setenv("AUTOTUNER_STARTED_AT", stamp)
        assert launched_s_ago() == 0.0
    monkeypatch.delenv("AUTOTUNER_STARTED_AT")
    assert launched_s_ago() == 0.0


def test_the_leaders_full_protocol_run_is_kept_beyond_the_share():
    kw = dict(leader_trials=4.5, verify_trials=3.0, after_s=15.0)
    # typical trial 30 s: the verification (90 s), the sweep and the leader's run (45 s) kept
    # whatever the share (84 s of 240); the two other leaders' runs are within the share
    assert budget(240.0, confirm_trials=1.5, **kw).time_for_trial([30.0]) == pytest.approx(
        240.0 - 150.0, abs=1.0
    )
    assert budget(240.0, **kw).time_for_trial([30.0]) == pytest.approx(240.0 - 105.0, abs=1.0)
    # before any trial is timed, no leader: a first guess of its run keeps no first trial out
    b = budget(120.0, confirm_trials=1.5, **kw)
    assert b.time_for_trial([]) == pytest.approx(120.0 - 75.0, abs=1.0)
    # a roomy budget keeps the same 4.5 trials for the leaders, the first's among them
    roomy = budget(1000.0, confirm_trials=1.5, **kw)
    assert roomy.time_for_trial([20.0]) == pytest.approx(1000.0 - 165.0, abs=1.0)


def test_a_costly_assembly_waits_for_time_and_keeps_to_its_share():
    b = budget(200.0)  # no reserve: 200 s left for trials
    # until one is timed, ten typical trials (1 s); the costly trials' share is a quarter
    assert b.affords_costly([1.0], [], spent_s=0.0, searched_s=0.0)
    assert not b.affords_costly([1.0], [], spent_s=45.0, searched_s=0.0)  # 55 s > 50 s
    assert b.affords_costly([1.0], [], spent_s=45.0, searched_s=100.0)  # of 300 s: 75 s
    assert not b.affords_costly([1.0], [60.0], spent_s=0.0, searched_s=0.0)  # as timed: 60 s
    # one timed quickly (a default compile) says little of the next (max-autotune): never
    # expected under ten typical trials
    assert b.affords_costly([1.0], [2.0], spent_s=39.0, searched_s=0.0)  # 49 s of 50 s
    assert not b.affords_costly([1.0], [2.0], spent_s=45.0, searched_s=0.0)  # 55 s > 50 s
    assert not budget(9.0).affords_costly([1.0], [], spent_s=0.0, searched_s=100.0)  # 10 > 9 s
    # with every other assembly run, the search's whole time is theirs
    assert b.affords_costly([1.0], [], spent_s=45.0, searched_s=0.0, share=1.0)


def test_a_first_verification_is_guessed_at_no_less_than_its_processes_start_up():
    # trials of a second: three of them (3 s) would not start the verification's two processes
    b = budget(100.0, verify_trials=3.0, verify_least_s=10.0)
    assert b.verify_estimate_s([1.0]) == 10.0 and b.verify_estimate_s([20.0]) == 60.0
    b.verify_s = 7.0  # as the study measured it
    assert b.verify_estimate_s([1.0]) == 7.0


def test_a_gpu_s_sweep_is_kept_two_typical_trials_once_trials_are_timed():
    # the sweep ends when its shapes are measured (1.4-1.5 trials in two GPU runs): its share of
    # the budget (90 s at 20 minutes) is kept only until trials show what a trial takes
    b = budget(1200.0, trial_timeout_s=300.0, after_s=5.0, sweep_s=90.0, sweep_trials=2.0)
    assert b.sweep_estimate_s([]) == 90.0
    assert b.sweep_estimate_s([12.0, 13.0, 14.0]) == 26.0
    assert b.sweep_estimate_s([60.0]) == 90.0  # never more than its share
    near_end = budget(60.0, after_s=5.0, sweep_s=90.0, sweep_trials=2.0)
    assert near_end.time_for_trial([12.0]) == pytest.approx(60.0 - 5.0 - 24.0, abs=1.0)
    cpu = budget(60.0, after_s=5.0, sweep_s=10.0)  # a CPU's keeps its limit
    assert cpu.sweep_estimate_s([1.0]) == 10.0
