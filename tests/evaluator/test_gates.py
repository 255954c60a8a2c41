"""The gates' rules on hand-made rows, which gate a target gets, and the gate as JSON."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from evaluator.case_rows import Row
from evaluator.gates import (
    CheckFailed,
    CourseGate,
    NoiseGate,
    NoisePrepared,
    gate_from_dict,
    select_gate,
)
from evaluator.noise import CaseNoise

REPO_ROOT = Path(__file__).resolve().parents[2]
COURSE_CONFIG = REPO_ROOT / "target" / "model_config.json"
ROWS = [Row(rid=0, life=0, position=4)]
F64 = torch.float64


def judge_one_row(precise: list, noise: float):
    """A noise judge for one call of one row whose allowance is `noise`."""
    precise = torch.tensor([precise], dtype=F64)
    case = CaseNoise(
        precise={0: precise},
        model={0: precise},
        row_noise={0: torch.tensor([noise], dtype=F64)},
        floor=noise,
        resolution=0.0,
    )
    return NoisePrepared(NoiseGate(), {"c": case}).judge("c")


def test_noise_gate_passes_within_the_multiple_and_fails_past_it():
    judge = judge_one_row([0.0, 1.0, 3.0], noise=0.1)
    judge.check(0, "step 0", ROWS, torch.tensor([[0.39, 1.0, 3.0]]))  # 3.9x the noise
    numbers = judge.summary()
    assert numbers["max_abs_err"] == pytest.approx(0.39)
    assert numbers["noise_share"] == pytest.approx(0.39 / 0.4)
    assert numbers["noise"] == 0.1
    assert (numbers["greedy_checked"], numbers["greedy_agreed"]) == (1, 1)
    with pytest.raises(CheckFailed, match=r"step 1: request 0 \(row 0, length 5\) max \|d\| 0.41"):
        judge.check(0, "step 1", ROWS, torch.tensor([[0.0, 1.0, 3.41]]))
    assert judge.summary()["noise_share"] == pytest.approx(0.41 / 0.4)


def test_noise_gate_fails_a_flipped_token_whose_margin_decides_it():
    # Margin 2.0 = 5x the noise 0.4 (> 2x): the token is decided. Each logit moves by at most
    # 1.1 < 4 x 0.4, so only the greedy rule can catch the flip.
    judge = judge_one_row([0.0, 1.0, 3.0], noise=0.4)
    with pytest.raises(CheckFailed, match="greedy token 1 != 2, whose margin 2 is 5x the noise"):
        judge.check(0, "step 0", ROWS, torch.tensor([[0.0, 2.0, 1.9]]))
    assert judge.summary()["greedy_checked"] == 1 and judge.summary()["greedy_agreed"] == 0
    # Margin 0.7 = 1.75x the noise: not decided, a flip is allowed.
    judge = judge_one_row([0.0, 2.3, 3.0], noise=0.4)
    judge.check(0, "step 0", ROWS, torch.tensor([[0.0, 3.0, 2.3]]))
    assert judge.summary()["greedy_checked"] == 0


def test_noise_gate_can_always_fail():
    # Noise so large that 4x it covers the logits' spread: nothing can be judged a pass.
    judge = judge_one_row([0.0, 1.0, 3.0], noise=0.5)
    with pytest.raises(CheckFailed, match="too large to judge"):
        judge.check(0, "step 0", ROWS, torch.tensor([[0.0, 1.0, 3.0]]))
    judge = judge_one_row([0.0, 1.0, 3.0], noise=math.nan)
    with pytest.raises(CheckFailed, match="too large to judge"):
        judge.check(0, "step 0", ROWS, torch.tensor([[0.0, 1.0, 3.0]]))
    judge = judge_one_row([0.0, 1.0, 3.0], noise=0.1)
    with pytest.raises(CheckFailed, match="max \\|d\\| inf"):
        judge.check(0, "step 0", ROWS, torch.tensor([[0.0, math.nan, 3.0]]))


def test_course_target_gets_the_course_gate(tmp_path):
    config = json.loads(COURSE_CONFIG.read_text())
    for path in (COURSE_CONFIG, Path("/target/model_config.json")):
        gate, reason = select_gate(path, config)
        assert gate == CourseGate(atol=1e-2, rtol=1e-2, measure_noise=True)
        assert reason.startswith(f"course gate: {path} is the course's float16 target")
        assert "atol=0.01 rtol=0.01" in reason and "\n" not in reason


def test_other_targets_get_the_noise_gate(tmp_path):
    config = json.loads(COURSE_CONFIG.read_text())
    copy = tmp_path / "model_config.json"
    shutil.copy(COURSE_CONFIG, copy)
    gate, reason = select_gate(copy, config)
    assert gate == NoiseGate(multiple=4.0, greedy_margin=2.0)
    assert reason.startswith(f"noise gate: {copy} is not the course's target; error within 4x")
    # The course's path with another dtype is not the course's model.
    gate, reason = select_gate(COURSE_CONFIG, {**config, "torch_dtype": "bfloat16"})
    assert gate.name == "noise"
    assert "is a bfloat16 model, the course's check is for float16" in reason


@pytest.mark.parametrize(
    "gate", [CourseGate(), CourseGate(atol=0.02, measure_noise=True), NoiseGate(dtype="bfloat16")]
)
def test_gate_round_trips_through_json(gate):
    assert gate_from_dict(json.loads(json.dumps(gate.to_dict()))) == gate


def test_unknown_gate_is_named():
    with pytest.raises(ValueError, match="unknown gate 'exact'; known: course, noise"):
        gate_from_dict({"name": "exact"})
