"""Course-format toy weights and their CLI."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from evaluator.toy_weights import make_toy_weights, save_toy_weights

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "generate_toy_weights.py"


def expected_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    v, h, i = config["vocab_size"], config["hidden_size"], config["intermediate_size"]
    nh, nkv, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    shapes = {"embed_tokens.weight": (v, h), "norm.weight": (h,), "lm_head.weight": (v, h)}
    for layer in range(config["num_hidden_layers"]):
        p = f"layers.{layer}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (nh * hd, h),
            p + "self_attn.k_proj.weight": (nkv * hd, h),
            p + "self_attn.v_proj.weight": (nkv * hd, h),
            p + "self_attn.o_proj.weight": (h, nh * hd),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
    return shapes


def test_keys_shapes_dtypes(tiny_config):
    weights = make_toy_weights(tiny_config)
    shapes = expected_shapes(tiny_config)
    assert set(weights) == set(shapes)
    for name, tensor in weights.items():
        assert tuple(tensor.shape) == shapes[name], name
        assert tensor.dtype == torch.float32, name
    # head_dim 24 != hidden 64 / heads 4: the projections follow head_dim.
    assert weights["layers.0.self_attn.q_proj.weight"].shape == (96, 64)
    assert weights["layers.1.self_attn.k_proj.weight"].shape == (48, 64)


def test_first_draw_is_the_embedding_like_the_course(tiny_config):
    weights = make_toy_weights(tiny_config, seed=1234)
    torch.manual_seed(1234)
    expected = torch.randn(tiny_config["vocab_size"], tiny_config["hidden_size"]) * 0.02
    assert torch.equal(weights["embed_tokens.weight"], expected)


def test_deterministic_per_seed_and_seeds_differ(tiny_config):
    a, b = make_toy_weights(tiny_config, seed=7), make_toy_weights(tiny_config, seed=7)
    c = make_toy_weights(tiny_config, seed=8)
    for name in a:
        assert torch.equal(a[name], b[name]), name
        if a[name].dim() == 2:
            assert not torch.equal(a[name], c[name]), name


def test_std_and_norms(tiny_config):
    weights = make_toy_weights(tiny_config)
    for name, tensor in weights.items():
        if tensor.dim() == 1:
            assert torch.equal(tensor, torch.ones_like(tensor)), name
        else:
            assert abs(tensor.std().item() - 0.02) < 0.002, name
            assert abs(tensor.mean().item()) < 0.002, name


def test_scales_multiply_only_qk_and_head(tiny_config):
    base = make_toy_weights(tiny_config, seed=3)
    sharp = make_toy_weights(tiny_config, seed=3, qk_scale=8.0, head_scale=10.0)
    for name in base:
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            factor = 8.0
        elif name == "lm_head.weight":
            factor = 10.0
        else:
            factor = 1.0
        assert torch.equal(sharp[name], base[name] * factor), name


def test_head_dim_defaults_to_hidden_over_heads(tiny_config):
    config = {k: v for k, v in tiny_config.items() if k != "head_dim"}
    weights = make_toy_weights(config)
    assert weights["layers.0.self_attn.q_proj.weight"].shape == (64, 64)
    assert weights["layers.0.self_attn.k_proj.weight"].shape == (32, 64)
    assert weights["layers.0.self_attn.o_proj.weight"].shape == (64, 64)


def test_missing_keys_raise_naming_them(tiny_config):
    config = {k: v for k, v in tiny_config.items() if k not in ("vocab_size", "hidden_size")}
    with pytest.raises(ValueError, match="vocab_size") as info:
        make_toy_weights(config)
    assert "hidden_size" in str(info.value)


def test_save_creates_dirs_and_round_trips(tiny_config, tmp_path):
    path = tmp_path / "a" / "b" / "model.pt"
    save_toy_weights(tiny_config, path, seed=5, qk_scale=2.0)
    loaded = torch.load(path, weights_only=True, map_location="cpu")
    expected = make_toy_weights(tiny_config, seed=5, qk_scale=2.0)
    assert set(loaded) == set(expected)
    assert all(torch.equal(loaded[k], expected[k]) for k in expected)


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_cli_writes_loadable_weights(tiny_config, tmp_path):
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(tiny_config))
    out = tmp_path / "w" / "model.pt"
    args = ("--config", str(config_path), "--output", str(out), "--seed", "11")
    result = run_cli(*args, "--qk-scale", "3", "--head-scale", "4", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert str(out) in result.stderr  # logging goes to stderr
    loaded = torch.load(out, weights_only=True, map_location="cpu")
    expected = make_toy_weights(tiny_config, seed=11, qk_scale=3.0, head_scale=4.0)
    assert all(torch.equal(loaded[k], expected[k]) for k in expected)


def test_cli_bad_config_exits_with_one_line_reason(tiny_config, tmp_path):
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps({k: v for k, v in tiny_config.items() if k != "vocab_size"}))
    out = tmp_path / "model.pt"
    result = run_cli("--config", str(config_path), "--output", str(out), cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "vocab_size" in result.stderr
    assert not out.exists()

    result = run_cli("--config", str(tmp_path / "absent.json"), "--output", str(out), cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "absent.json" in result.stderr
