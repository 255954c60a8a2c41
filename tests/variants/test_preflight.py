"""resolve_target: a user's folder is read, never written; toy weights only for the embedded
default; every bad folder or config is one TargetError line naming the cause and the fix."""

import hashlib
import json

import pytest
import torch
from safetensors.torch import save_file

import variants.checkpoint.preflight as target_module
from evaluator.toy_weights import make_toy_weights
from variants.checkpoint.preflight import TargetError, resolve_target


def _tree_digest(folder) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def _hf_folder(config, folder, tie=False):
    """A Hugging Face-style folder: config.json and model.safetensors with `model.` keys."""
    folder.mkdir(exist_ok=True)
    llama = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    (folder / "config.json").write_text(json.dumps({**config, **llama, "tie_word_embeddings": tie}))
    state = {f"model.{k}": v for k, v in make_toy_weights(config).items() if k != "lm_head.weight"}
    if not tie:
        state["lm_head.weight"] = torch.randn(config["vocab_size"], config["hidden_size"])
    save_file(state, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("tie", [False, True])
def test_a_hugging_face_folder_is_read_and_left_as_it_is(tiny_config, tmp_path, tie):
    folder = _hf_folder(tiny_config, tmp_path / "hf", tie)
    before = _tree_digest(folder)
    target = resolve_target(str(folder / "config.json"), None)  # the weights: the config's folder
    assert _tree_digest(folder) == before
    assert target.weight_dir == folder.resolve()
    assert target.weights_file.endswith("model.safetensors") and len(target.fingerprint) == 16
    # the written engine carries the reader of one safetensors file, no other format's
    assert target.weights_format == "safetensors"


def test_the_fingerprint_tells_other_weights_of_one_shape_apart(tiny_config, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, seed in ((a, 1), (b, 2)):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(tiny_config))
        torch.save(make_toy_weights(tiny_config, seed=seed), folder / "model.pt")
    fa, fb = (resolve_target(str(f / "config.json"), None).fingerprint for f in (a, b))
    assert fa != fb and fa == resolve_target(str(a / "config.json"), str(a)).fingerprint
    # a course-layout model.pt: the written engine carries that reader alone
    assert resolve_target(str(a / "config.json"), None).weights_format == "course"


@pytest.mark.parametrize("extra", [{"hidden_act": "silu"}, {"dtype": "float16"}])
def test_a_course_model_pt_with_a_hugging_face_config_needs_the_full_readers(
    tiny_config, tmp_path, extra
):
    """The course's config reader takes the course's keys alone: a config with another key is
    read by the library's reader, in the written engine too."""
    (tmp_path / "config.json").write_text(json.dumps({**tiny_config, **extra}))
    torch.save(make_toy_weights(tiny_config), tmp_path / "model.pt")
    assert resolve_target(str(tmp_path / "config.json"), None).weights_format == "any"


def test_only_the_embedded_default_gets_toy_weights(tiny_config, tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "target").mkdir(parents=True)
    (repo / "target" / "model_config.json").write_text(json.dumps(tiny_config))
    monkeypatch.setattr(target_module, "REPO_ROOT", repo)
    monkeypatch.setattr(target_module, "default_target_paths", lambda root: (
        root / "target" / "model_config.json", root / "target" / "weights"))  # fmt: skip
    target = resolve_target(None, None)
    assert (repo / "target" / "weights" / "model.pt").is_file()
    assert any("generated the public toy weights" in n for n in target.notes)
    user = tmp_path / "user"
    user.mkdir()
    with pytest.raises(TargetError, match=r"^no weights in .*user: .*; pass --weight-dir"):
        resolve_target(str(repo / "target" / "model_config.json"), str(user))
    assert list(user.iterdir()) == []  # nothing written into the user's folder


def _course_folder(config, folder, state):
    folder.mkdir()
    (folder / "model_config.json").write_text(json.dumps(config))
    torch.save(state, folder / "model.pt")
    return folder / "model_config.json"


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda s: s.pop("layers.1.mlp.up_proj.weight"),
            r"do not fit model_config.json: weight 'layers.1.mlp.up_proj.weight' is missing",
        ),
        (
            lambda s: s.__setitem__("norm.weight", torch.ones(65)),
            r"weight 'norm.weight' has shape \[65\], expected \[64\]",
        ),
        (
            lambda s: s.__setitem__("layers.2.input_layernorm.weight", torch.ones(64)),
            r"belongs to layer 2, but num_hidden_layers is 2",
        ),
        (
            lambda s: s.__setitem__("layers.0.self_attn.q_proj.bias", torch.ones(96)),
            r"is a bias, which this model.s layers do not have",
        ),
    ],
    ids=["missing", "shape", "extra-layer", "bias"],
)
def test_weights_that_do_not_fit_the_config_name_the_key(tiny_config, tmp_path, change, message):
    state = make_toy_weights(tiny_config)
    change(state)
    config = _course_folder(tiny_config, tmp_path / "m", state)
    with pytest.raises(TargetError, match=message) as caught:
        resolve_target(str(config), None)
    assert "\n" not in str(caught.value) and str(caught.value).endswith("weights of one model")


@pytest.mark.parametrize(
    "text, message",
    [
        ("{bad", r"is not valid JSON: .*; pass --model-config"),
        ('{"vocab_size": 4}', r"missing or invalid hidden_size"),
        (None, r"cannot read model config .*nope.json: No such file"),
    ],
)
def test_a_bad_config_is_one_line(tmp_path, text, message):
    path = tmp_path / "nope.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(TargetError, match=message):
        resolve_target(str(path), str(tmp_path))


def test_an_inconsistent_config_says_what_to_fix(tiny_config, tmp_path):
    config = _course_folder(
        {**tiny_config, "num_key_value_heads": 3}, tmp_path / "m", make_toy_weights(tiny_config)
    )
    with pytest.raises(TargetError, match=r"not a multiple of num_key_value_heads 3; fix the"):
        resolve_target(str(config), None)
