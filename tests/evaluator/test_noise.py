"""The noise measurement: which reference is precise, and the allowance a row is measured in."""

import torch

from evaluator.noise import CaseNoise, precise_dtype_for


def test_precise_dtype_rule():
    assert precise_dtype_for(torch.bfloat16, "cpu") == torch.float64
    assert precise_dtype_for(torch.float16, "cpu") == torch.float64
    assert precise_dtype_for(torch.float32, "cpu") == torch.float64
    assert precise_dtype_for(torch.bfloat16, "cuda") == torch.float32
    assert precise_dtype_for(torch.float16, torch.device("cuda", 1)) == torch.float32
    assert precise_dtype_for(torch.float32, "cuda") == torch.float64


def test_allowance_floors_each_row():
    precise = torch.tensor([[0.0, 10.0], [0.0, 1000.0], [0.0, 1.0]], dtype=torch.float64)
    noise = CaseNoise(
        precise={0: precise},
        model={0: precise},
        row_noise={0: torch.tensor([0.5, 0.01, 0.001], dtype=torch.float64)},
        floor=0.1,
        resolution=torch.finfo(torch.bfloat16).eps,  # 2**-7
    )
    # Row 0: its own noise. Row 1: one rounding step of 1000 (7.8) beats the case's 0.1.
    # Row 2: the case's floor, not the row's lucky 0.001.
    assert noise.allowance(0).tolist() == [0.5, 1000 * 2**-7, 0.1]
