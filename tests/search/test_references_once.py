"""The gate's references are computed once, by the main job, before any trial or warm-up child:
the children read them from the noise cache instead of each loading the model's reference."""

import pytest
import torch

from evaluator import gates
from evaluator.gates import CourseGate, NoiseGate
from search.trial import NOT_IN_JOB, TrialRunner, prepare_gate


def runner_job(runner: TrialRunner) -> dict:
    return {name: value for name, value in vars(runner).items() if name not in NOT_IN_JOB}


@pytest.mark.parametrize("gate", [CourseGate(measure_noise=True), NoiseGate()], ids=str)
def test_the_references_are_kept_whole_and_trials_load_no_model(
    tiny_config, tiny_weights, tmp_path, monkeypatch, gate
):
    runner = TrialRunner(
        tiny_config, tiny_weights, "cpu", gate=gate.to_dict(), noise_cache=str(tmp_path)
    )
    assert runner.keep_references() > 0
    assert len(list(tmp_path.glob("noise-*.pt"))) == 1
    _, prepared = prepare_gate(runner_job(runner))
    rows = sum(len(r) for case in prepared.rows.values() for r in case.steps.values())
    if gate.name == "course":
        kept = torch.load(next(tmp_path.glob("reference-*.pt")), weights_only=True)
        assert len(kept["keys"]) == rows > 20  # every row of both cases

    def no_model(*args, **kwargs):
        raise AssertionError("a trial loaded the reference model")

    monkeypatch.setattr(gates, "load_reference", no_model)
    monkeypatch.setattr("evaluator.noise.load_reference", no_model)
    _, again = prepare_gate(runner_job(runner))
    again.judges.fill()  # every row is there already


def test_without_a_noise_cache_nothing_is_kept(tiny_config, tiny_weights):
    runner = TrialRunner(tiny_config, tiny_weights, "cpu")
    assert runner.keep_references() < 1.0
