"""Course-format toy weights: a plain float32 state dict, `randn * 0.02` matrices, norms ones.

With the default scales this reproduces the course's public toy weights for a given seed.
`qk_scale` / `head_scale` sharpen attention and logits so tests can see RoPE and masking bugs.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

REQUIRED_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
)


def weight_shapes(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """Every weight's name and shape, in the order the random generator draws them.

    Order: embed_tokens; per layer input_layernorm, q, k, v, o, post_attention_layernorm,
    gate, up, down; then norm, lm_head. Norms draw no random numbers.
    """
    missing = [k for k in REQUIRED_KEYS if k not in config]
    if missing:
        raise ValueError(f"model config is missing required key(s): {', '.join(missing)}")
    v, h, i = config["vocab_size"], config["hidden_size"], config["intermediate_size"]
    nh, nkv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim") or h // nh
    shapes: list[tuple[str, tuple[int, ...]]] = [("embed_tokens.weight", (v, h))]
    for layer in range(config["num_hidden_layers"]):
        p = f"layers.{layer}."
        shapes += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (nh * hd, h)),
            (p + "self_attn.k_proj.weight", (nkv * hd, h)),
            (p + "self_attn.v_proj.weight", (nkv * hd, h)),
            (p + "self_attn.o_proj.weight", (h, nh * hd)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (i, h)),
            (p + "mlp.up_proj.weight", (i, h)),
            (p + "mlp.down_proj.weight", (h, i)),
        ]
    shapes += [("norm.weight", (h,)), ("lm_head.weight", (v, h))]
    return shapes


def make_toy_weights(
    config: dict, seed: int = 1234, qk_scale: float = 1.0, head_scale: float = 1.0
) -> dict[str, torch.Tensor]:
    """The course toy weights for `config`; the scales multiply q/k_proj and lm_head."""
    shapes = weight_shapes(config)
    torch.manual_seed(seed)
    weights: dict[str, torch.Tensor] = {}
    for name, shape in shapes:
        if len(shape) == 1:
            weights[name] = torch.ones(shape, dtype=torch.float32)
            continue
        w = torch.randn(shape, dtype=torch.float32) * 0.02
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            w = w * qk_scale
        elif name == "lm_head.weight":
            w = w * head_scale
        weights[name] = w
    return weights


def save_toy_weights(
    config: dict,
    path: str | os.PathLike,
    seed: int = 1234,
    qk_scale: float = 1.0,
    head_scale: float = 1.0,
) -> Path:
    """Write `make_toy_weights(...)` to `path` with `torch.save`, creating parent dirs."""
    weights = make_toy_weights(config, seed=seed, qk_scale=qk_scale, head_scale=head_scale)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(weights, path)
    return path
