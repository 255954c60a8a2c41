"""ModelSpec: defaults, named errors for missing or inconsistent keys, the compute-dtype rule."""

import dataclasses

import pytest
import torch

from evaluator.reference_model import compute_dtype_for
from variants.checkpoint.hf_llama import rope_layout_of
from variants.probe import probe_capabilities
from variants.registry import _resolved_dtype
from variants.spec import ModelSpec, dtype_from_name

REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
)


def test_tiny_config_fields(tiny_config):
    spec = ModelSpec.from_config(tiny_config)
    assert (spec.vocab_size, spec.hidden_size, spec.intermediate_size) == (256, 64, 96)
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads) == (2, 4, 2)
    # head_dim is explicit and differs from hidden / heads = 16.
    assert spec.head_dim == 24 and spec.max_positions == 512
    assert spec.group_size == 2
    assert spec.config_dtype == torch.float16
    # K and V, 2 layers, 2 kv heads, 24 dims, 2 bytes.
    assert spec.kv_bytes_per_token(torch.float16) == 2 * 2 * 2 * 24 * 2


def test_defaults_when_optional_keys_are_absent(tiny_config):
    config = {k: tiny_config[k] for k in REQUIRED}
    spec = ModelSpec.from_config(config)
    assert spec.head_dim == 64 // 4
    assert spec.num_kv_heads == spec.num_heads == 4
    assert spec.rms_norm_eps == 1e-5
    assert spec.rope_theta == 10000.0
    assert spec.config_dtype == torch.float16
    assert spec.tie_word_embeddings is False


def test_explicit_optional_values_are_kept(tiny_config):
    config = {**tiny_config, "rms_norm_eps": 1e-6, "rope_theta": 500000, "torch_dtype": "bf16"}
    spec = ModelSpec.from_config(config)
    assert spec.rms_norm_eps == 1e-6 and spec.rope_theta == 500000.0
    assert isinstance(spec.rope_theta, float)
    assert spec.config_dtype == torch.bfloat16


@pytest.mark.parametrize("key", REQUIRED)
def test_each_missing_required_key_is_named(tiny_config, key):
    config = {k: v for k, v in tiny_config.items() if k != key}
    with pytest.raises(ValueError, match=f"missing required key.*{key}"):
        ModelSpec.from_config(config)


def test_all_missing_keys_are_named_at_once():
    with pytest.raises(ValueError) as info:
        ModelSpec.from_config({"vocab_size": 10})
    for key in REQUIRED[1:]:
        assert key in str(info.value)
    assert "vocab_size" not in str(info.value)


def test_non_dict_config_is_refused():
    with pytest.raises(TypeError, match="must be a dict, got list"):
        ModelSpec.from_config([("vocab_size", 10)])


@pytest.mark.parametrize("heads, kv_heads", [(4, 3), (4, 8), (6, 4)])
def test_heads_not_a_multiple_of_kv_heads(tiny_config, heads, kv_heads):
    config = {**tiny_config, "num_attention_heads": heads, "num_key_value_heads": kv_heads}
    with pytest.raises(ValueError, match=f"num_attention_heads {heads} is not a multiple of"):
        ModelSpec.from_config(config)


def test_odd_head_dim_is_refused(tiny_config):
    with pytest.raises(ValueError, match="head_dim 23 must be even"):
        ModelSpec.from_config({**tiny_config, "head_dim": 23})


def test_head_dim_absent_and_hidden_not_divisible(tiny_config):
    config = {k: v for k, v in tiny_config.items() if k != "head_dim"}
    config["num_attention_heads"] = config["num_key_value_heads"] = 3
    with pytest.raises(ValueError, match="hidden_size 64 is not divisible by"):
        ModelSpec.from_config(config)


@pytest.mark.parametrize("key", ["vocab_size", "num_hidden_layers", "num_key_value_heads"])
def test_non_positive_sizes_are_named(tiny_config, key):
    field = {"num_hidden_layers": "num_layers", "num_key_value_heads": "num_kv_heads"}.get(key, key)
    with pytest.raises(ValueError, match=f"{field} must be positive, got 0"):
        ModelSpec.from_config({**tiny_config, key: 0})


def test_zero_heads_without_head_dim_is_a_named_error(tiny_config):
    config = {k: v for k, v in tiny_config.items() if k != "head_dim"}
    config["num_attention_heads"] = 0
    with pytest.raises(ValueError, match="num_attention_heads"):
        ModelSpec.from_config(config)


def test_unknown_torch_dtype_is_refused(tiny_config):
    with pytest.raises(ValueError, match="unsupported torch_dtype 'float64'"):
        ModelSpec.from_config({**tiny_config, "torch_dtype": "float64"})


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("float16", torch.float16),
        ("fp16", torch.float16),
        ("half", torch.float16),
        ("torch.float16", torch.float16),
        ("bfloat16", torch.bfloat16),
        ("BF16", torch.bfloat16),
        ("float32", torch.float32),
        (torch.float32, torch.float32),
    ],
)
def test_dtype_from_name(name, dtype):
    assert dtype_from_name(name) == dtype


@pytest.mark.parametrize(
    "torch_dtype, device, expected",
    [
        ("float16", "cpu", torch.float32),
        ("bfloat16", "cpu", torch.float32),
        ("float32", "cpu", torch.float32),
        ("float16", "cuda", torch.float16),
        ("float16", "cuda:1", torch.float16),
        ("bfloat16", "cuda", torch.bfloat16),
        ("bf16", "cuda:0", torch.bfloat16),
        # The reference's rule: anything but bfloat16 computes in float16 on CUDA.
        ("float32", "cuda", torch.float16),
        ("float16", "meta", torch.float32),
    ],
)
def test_compute_dtype_rule(tiny_config, torch_dtype, device, expected):
    spec = ModelSpec.from_config({**tiny_config, "torch_dtype": torch_dtype})
    assert spec.compute_dtype(device) == expected
    assert spec.compute_dtype(torch.device(device)) == expected
    assert compute_dtype_for({"torch_dtype": torch_dtype}, device) == expected


def test_compute_dtype_default_is_float16_on_cuda(tiny_config):
    config = {k: v for k, v in tiny_config.items() if k != "torch_dtype"}
    assert ModelSpec.from_config(config).compute_dtype("cuda") == torch.float16


@pytest.mark.parametrize(
    "overrides",
    [
        {"torch_dtype": "float16"},
        {"torch_dtype": "bfloat16"},
        {"torch_dtype": "bf16"},
        {"torch_dtype": "torch.bfloat16"},
        {"torch_dtype": "BF16"},
        {"torch_dtype": None, "dtype": "bfloat16"},
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
def test_every_dtype_rule_agrees_on_cuda(tiny_config, cpu_caps, overrides):
    """Three places map the config to the CUDA compute dtype: the spec (what the engine uses),
    the reference (what the judge uses) and probe + registry (which dtype choices exist)."""
    config = {**tiny_config, **overrides}
    config = {k: v for k, v in config.items() if v is not None}
    engine_dtype = ModelSpec.from_config(config).compute_dtype("cuda")
    judge_dtype = compute_dtype_for(config, "cuda")
    probed = probe_capabilities("cpu", config)
    offered = _resolved_dtype(dataclasses.replace(probed, device_type="cuda"), {})
    assert engine_dtype == judge_dtype
    assert str(engine_dtype).replace("torch.", "") == offered


def test_spec_is_frozen(tiny_spec):
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny_spec.head_dim = 8


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ({"attention_bias": True}, "attention_bias is true"),
        ({"rope_scaling": {"rope_type": "dynamic"}}, "rope_scaling type 'dynamic' is not computed"),
        ({"rope_theta": 0}, "rope_theta must be positive"),
        (
            {"rope_theta": 10000, "rope_parameters": {"rope_theta": 500000}},
            "rope_theta and rope_parameters disagree",
        ),
    ],
)
def test_unsupported_model_features_are_named(tiny_config, overrides, message):
    with pytest.raises(ValueError, match=message):
        ModelSpec.from_config({**tiny_config, **overrides})


def test_rope_layout_from_the_config(tiny_config):
    assert rope_layout_of(ModelSpec.from_config(tiny_config).config) == "interleaved"
    llama = ModelSpec.from_config({**tiny_config, "model_type": "llama"})
    assert rope_layout_of(llama.config) == "rotate_half"
    theta = ModelSpec.from_config(
        {**tiny_config, "rope_theta": None, "rope_parameters": {"rope_theta": 500000.0}}
    ).rope_theta
    assert theta == 500000.0
