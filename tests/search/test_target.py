"""resolve_target: toy weights fill a folder without weights, and never shadow a model's own
weights in another format (a Hugging Face folder's model.safetensors)."""

import json

import torch
from safetensors.torch import save_file

from search.target import resolve_target


def test_a_safetensors_folder_is_left_as_it_is(tiny_config, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(tiny_config))
    save_file({"model.norm.weight": torch.ones(64)}, str(tmp_path / "model.safetensors"))
    target = resolve_target(str(tmp_path / "config.json"), str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    assert target.notes == [] and target.weight_dir == tmp_path.resolve()


def test_a_folder_without_weights_gets_the_toy_weights(tiny_config, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(tiny_config))
    target = resolve_target(str(tmp_path / "config.json"), str(tmp_path / "weights"))
    assert (tmp_path / "weights" / "model.pt").is_file()
    assert target.notes == [f"generated the public toy weights (seed 1234) into {tmp_path}/weights"]
