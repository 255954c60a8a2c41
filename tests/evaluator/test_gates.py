"""The noise gate's rules on hand-made rows: the multiple, the greedy margin, the refusal to pass
what it cannot judge."""

import math

import pytest
import torch

from evaluator.case_rows import Row
from evaluator.gates import CheckFailed, NoiseGate, NoisePrepared
from evaluator.noise import CaseNoise

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
