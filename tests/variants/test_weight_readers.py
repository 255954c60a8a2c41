"""The weight readers an engine can carry: the course's model.pt alone, one safetensors file,
or every format; `weights_format` says which a target needs, from its file's name and tensors."""

import pytest
import torch

from evaluator.toy_weights import save_toy_weights
from variants.checkpoint import course_file, reader
from variants.spec import ModelSpec


@pytest.fixture
def course_dir(tiny_config, tmp_path):
    save_toy_weights(tiny_config, tmp_path / "model.pt", seed=5)
    return tmp_path


def test_both_readers_read_a_course_model_pt_alike(tiny_spec, course_dir):
    lean = course_file.course_state_dict(tiny_spec, str(course_dir))
    full = reader.course_state_dict(tiny_spec, str(course_dir))
    assert lean.keys() == full.keys()
    assert all(torch.equal(lean[k], full[k]) for k in lean)
    assert reader.weights_format(tiny_spec, str(course_dir / "model.pt"), lean) == "course"


def test_the_course_reader_names_a_missing_weight(tiny_spec, course_dir):
    state = torch.load(course_dir / "model.pt", weights_only=True)
    del state["norm.weight"]
    torch.save(state, course_dir / "model.pt")
    with pytest.raises(KeyError, match="norm.weight"):
        course_file.course_state_dict(tiny_spec, str(course_dir))


def test_anything_but_a_course_model_pt_or_one_safetensors_needs_the_full_reader(
    tiny_config, course_dir
):
    spec = ModelSpec.from_config(tiny_config)
    state = torch.load(course_dir / "model.pt", weights_only=True)
    path = str(course_dir / "model.pt")
    prefixed = {("model." + k if k != "lm_head.weight" else k): v for k, v in state.items()}
    tied = {k: v for k, v in state.items() if k != "lm_head.weight"}
    assert reader.weights_format(spec, path, prefixed) == "any"
    assert reader.weights_format(spec, path, tied) == "any"
    for name in ("model.safetensors", "weights.safetensors"):
        assert reader.weights_format(spec, str(course_dir / name), state) == "safetensors"
    for name in ("model.safetensors.index.json", "pytorch_model.bin", "weights.pt"):
        assert reader.weights_format(spec, str(course_dir / name), state) == "any"
    tie_config = ModelSpec.from_config({**tiny_config, "tie_word_embeddings": True})
    assert reader.weights_format(tie_config, path, state) == "any"
