"""The two config readers an engine can carry: the course's keys alone (course_config.py), or
Hugging Face's too (hf_config.py, the library's); `reads_as_course` says when the first reads a
config as the second does."""

import json
from pathlib import Path

import pytest

from variants.checkpoint import course_config, hf_config, preflight
from variants.spec import ModelSpec

COURSE_TARGET = Path(__file__).resolve().parents[2] / "target" / "model_config.json"


@pytest.fixture(params=["tiny", "target"])
def course_config_dict(request, tiny_config):
    return tiny_config if request.param == "tiny" else json.loads(COURSE_TARGET.read_text())


def test_the_course_reader_takes_the_course_s_configs_as_they_are(course_config_dict):
    assert course_config.course_keys(course_config_dict) is course_config_dict
    assert hf_config.course_keys(course_config_dict) == course_config_dict
    assert preflight.reads_as_course(course_config_dict)


@pytest.mark.parametrize(
    "extra",
    [
        {"hidden_act": "silu"},
        {"dtype": "bfloat16"},
        {"rope_parameters": {"rope_theta": 10000.0}},
        {"rope_scaling": None},
        {"tie_word_embeddings": False},
        {"attention_bias": False},
        {"bos_token_id": 1},
    ],
    ids=lambda extra: next(iter(extra)),
)
def test_the_course_reader_refuses_any_other_key_by_name(tiny_config, extra):
    """A key the course's config does not have might change the model: never ignored."""
    key = next(iter(extra))
    with pytest.raises(ValueError, match=f"'{key}' is not one of the course's config keys"):
        course_config.course_keys({**tiny_config, **extra})
    assert not preflight.reads_as_course({**tiny_config, **extra})


@pytest.mark.parametrize("absent", ["head_dim", "num_key_value_heads", "torch_dtype", "rope_theta"])
def test_a_course_config_the_library_fills_in_needs_the_library_s_reader(tiny_config, absent):
    config = {k: v for k, v in tiny_config.items() if k != absent}
    assert not preflight.reads_as_course(config)
    assert absent in hf_config.course_keys(config)


def test_a_config_the_library_refuses_is_no_course_config(tiny_config):
    assert not preflight.reads_as_course({**tiny_config, "hidden_act": "gelu"})


def test_hugging_face_keys_in_the_course_s(tiny_config):
    hf = {k: v for k, v in tiny_config.items() if k not in ("torch_dtype", "rope_theta")}
    hf = {**hf, "dtype": "bfloat16", "rope_parameters": {"rope_theta": 500000.0}}
    del hf["head_dim"], hf["num_key_value_heads"]
    given = json.loads(json.dumps(hf))
    keys = hf_config.course_keys(hf)
    assert keys["torch_dtype"] == "bfloat16" and keys["rope_theta"] == 500000.0
    assert keys["head_dim"] == 64 // 4 and keys["num_key_value_heads"] == 4
    assert hf == given  # the config as given is left as it was
    spec = ModelSpec.from_config(hf)
    assert (spec.head_dim, spec.num_kv_heads, spec.rope_theta) == (16, 4, 500000.0)
