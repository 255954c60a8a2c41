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


def test_a_kept_measurement_is_keyed_by_the_judge_s_version(tmp_path, tiny_weights, monkeypatch):
    """A Hugging Face folder's reference is transformers' model: another transformers version
    measures again; the course's model.pt is judged by our own math, whatever is installed."""
    from safetensors.torch import save_file

    from evaluator import noise as noise_module

    save_file({"model.norm.weight": torch.ones(4)}, str(tmp_path / "model.safetensors"))
    keys = {}
    for version in ("4.47.1", "5.25.0"):
        monkeypatch.setattr(noise_module.metadata, "version", lambda name, v=version: v)
        keys[version] = [
            noise_module.noise_key({"model_type": "llama"}, folder, "cpu", torch.float32, {})
            for folder in (tmp_path, tiny_weights)
        ]
    assert keys["4.47.1"][0] != keys["5.25.0"][0]  # the Hugging Face folder
    assert keys["4.47.1"][1] == keys["5.25.0"][1]  # the course's model.pt
