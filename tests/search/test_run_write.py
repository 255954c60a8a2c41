"""The main job's re-measurement leaves the verification and the shape sweep their time."""

from types import SimpleNamespace

from search.setup import SWEEP_TRIALS, Budget, sweep_reserve_s
from search.trial import Record
from search.write import after_remeasure_s, remeasure
from variants.variant import Variant


class Clock:
    def __init__(self, left: float):
        self.left = left


class FakeRunner:
    """Each full-protocol run takes its trial's seconds off the clock."""

    timeout_s = 300.0  # a trial's limit

    def __init__(self, clock: Clock, durations: list[float]):
        self.clock, self.durations, self.runs = clock, durations, []

    def run(self, variant, protocol, check, timeout_s):
        self.runs.append(variant.name)
        self.clock.left -= 20.0
        attrs = {"full_tokens_per_s": 1000.0 - len(self.runs)}
        return SimpleNamespace(status="ok", attrs=attrs, reason="")


def job(device: str, left: float, durations=(19.0, 20.0, 18.0, 22.0)):
    clock = Clock(left)
    kind = "cpu" if device == "cpu" else "cuda"
    sweep = dict(sweep_s=sweep_reserve_s(kind, 240.0), sweep_trials=SWEEP_TRIALS[kind])
    return SimpleNamespace(
        device=device,
        runner=FakeRunner(clock, list(durations)),
        args=SimpleNamespace(remeasure=3),
        budget=Budget(0.0, 300.0, leader_trials=4.5, verify_trials=3.0, **sweep),
        seconds_left=lambda: clock.left,
        study=None,
        notes=[],
    )


def leaders(n: int = 3) -> list[Record]:
    return [
        Record(
            i,
            "ok",
            Variant(cache="paged", block_size=16 * (i + 1)).to_dict(),
            {
                "tokens_per_s": 100.0 - i,
                "peak_mib": 1.0,
                "constraint": [-1.0],
                "variant_name": f"v{i}",
                "trial_seconds": 20.0,
            },  # fmt: skip
            (100.0 - i, 1.0),
        )
        for i in range(n)
    ]


def test_after_the_remeasure_a_job_keeps_its_verification_and_the_sweep():
    # three median trials (19.5 s) for the verification; on a 4-minute GPU budget the sweep's
    # share (20 s of shapes, 28 s of builds) or two typical trials where less; on a CPU 10 s of
    # shapes; 5 s to wrap up
    assert after_remeasure_s(job("cuda:0", 100.0)) == 3 * 19.5 + 2 * 19.5 + 5.0
    assert after_remeasure_s(job("cuda", 100.0, durations=())) == 3 * 20.0 + 48.0 + 5.0
    assert after_remeasure_s(job("cpu", 100.0)) == 3 * 19.5 + 10.0 + 5.0
    measured = job("cpu", 100.0)
    measured.budget.verify_s = 34.7  # the study's own verification
    assert after_remeasure_s(measured) == 34.7 + 10.0 + 5.0


def test_a_short_budget_skips_the_remeasure_rather_than_overrunning():
    # On the H200, 84 s were left after the search of a 4-minute study; re-measuring three
    # leaders there, then verifying and sweeping, ended 57 s past the budget.
    short = job("cuda", 84.0)
    records = leaders()
    remeasure(short, records)
    assert short.runner.runs == []
    assert not any("full_tokens_per_s" in r.attrs for r in records)
    assert short.notes == [
        "full-protocol re-measure: 3 leader(s) keep their screening numbers; the verification "
        "and the shape sweep need the budget's last 102 s"
    ]


def test_the_leaders_are_remeasured_while_the_later_steps_still_fit():
    # 102.5 s kept for later and 30 s expected a leader (a GPU's full protocol: 1.5 trials), 20
    # s taken: 61.5 s free before the first, 41.5 s before the second, 21.5 s before the third.
    roomy = job("cuda", 164.0)
    records = leaders()
    remeasure(roomy, records)
    assert roomy.runner.runs == [Variant.from_dict(records[i].variant).name for i in (0, 1)]
    assert [("full_tokens_per_s" in r.attrs) for r in records] == [True, True, False]
    assert roomy.notes[0].startswith("full-protocol re-measure: 1 leader(s) keep their screening")


class CutShort(FakeRunner):
    """A full-protocol run killed at its limit: the budget's, not the variant's."""

    def run(self, variant, protocol, check, timeout_s):
        self.runs.append((variant.name, timeout_s))
        self.clock.left -= timeout_s
        return SimpleNamespace(status="failed", attrs={"timed_out": True}, reason="timed out")


def test_the_leader_is_confirmed_in_the_reserve_kept_for_it_and_a_cut_run_rules_nothing_out():
    # 128 s left, 102.5 s kept for later: the first leader (1.5 trials, 30 s, expected on a
    # GPU) still runs in half of it, limited to the 30 s it expects; the second waits for 30 s
    tight = job("cuda", 128.0)
    records = leaders()
    remeasure(tight, records)
    assert tight.runner.runs == [Variant.from_dict(records[0].variant).name]
    assert records[0].has_full
    # a run the budget cut short is no verdict: the leader keeps its screening numbers and rank
    cut = job("cuda", 128.0)
    cut.runner = CutShort(Clock(128.0), [19.0, 20.0])
    cut.seconds_left = lambda: cut.runner.clock.left
    records = leaders()
    remeasure(cut, records)
    assert cut.runner.runs == [(Variant.from_dict(records[0].variant).name, 30.0)]
    assert not any(k.startswith("full_") for r in records for k in r.attrs)


def test_on_a_cpu_the_leaders_confirmation_comes_before_the_sweep():
    # 80 s left: the verification (58.5 s) and the wrap-up (5 s) leave 16.5 s, half a CPU
    # leader's expected 30 s and more; the sweep's 10 s, which takes what is left, wait
    cpu = job("cpu", 80.0)
    records = leaders()
    remeasure(cpu, records)
    assert cpu.runner.runs == [Variant.from_dict(records[0].variant).name]
