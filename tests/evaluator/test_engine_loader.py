"""check_weight_dir takes every folder the engine's loader reads, and names what is missing."""

import pytest
import torch
from safetensors.torch import save_file

from evaluator.engine_loader import EngineLoadError, check_weight_dir


def test_a_hugging_face_folder_is_a_weight_dir(tmp_path):
    save_file({"model.norm.weight": torch.ones(4)}, str(tmp_path / "model.safetensors"))
    assert check_weight_dir(tmp_path) == str(tmp_path)


def test_the_course_folder_is_a_weight_dir(tiny_weights):
    assert check_weight_dir(tiny_weights) == tiny_weights


def test_a_folder_without_weights_is_named(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(
        EngineLoadError,
        match=r"^no weights in .*: expected the course's model.pt or a Hugging Face folder's ",
    ):
        check_weight_dir(tmp_path)
    with pytest.raises(EngineLoadError, match=r"^no weights: .*absent does not exist$"):
        check_weight_dir(tmp_path / "absent")
