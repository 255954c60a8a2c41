"""The reference's forward pass written out per layer, with the RoPE function and the token
positions as parameters: the planted faults that get one of them wrong share it. Not an engine.
"""

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from evaluator.reference_model import apply_rope, rms_norm  # noqa: E402


def rope_tables(model, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin `[T, head_dim / 2]` in the compute dtype at the given positions."""
    d = model.head_dim
    inv_freq = 1.0 / model.rope_theta ** (
        torch.arange(0, d, 2, dtype=torch.float32, device=model.device) / d
    )
    angles = positions.to(model.device, torch.float32)[:, None] * inv_freq
    return angles.cos().to(model.compute_dtype), angles.sin().to(model.compute_dtype)


def last_logits(model, tokens: torch.Tensor, positions=None, rope=apply_rope) -> torch.Tensor:
    """Float32 logits `[vocab]` after the last of `tokens` (1-D); `positions` default 0..T-1."""
    m, w = model, model.w
    t = len(tokens)
    if positions is None:
        positions = torch.arange(t)
    cos, sin = rope_tables(m, positions)
    x = w["embed_tokens.weight"][tokens]
    mask = torch.ones(t, t, dtype=torch.bool, device=m.device).triu(1)
    group = m.num_heads // m.num_kv_heads
    for i in range(m.num_layers):
        p = f"layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], m.eps)
        q, k, v = (
            F.linear(h, w[p + f"self_attn.{n}_proj.weight"]).view(t, -1, m.head_dim).transpose(0, 1)
            for n in "qkv"
        )
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        scores = q.float() @ k.float().transpose(-1, -2) / math.sqrt(m.head_dim)
        probs = scores.masked_fill(mask, float("-inf")).softmax(-1).to(m.compute_dtype)
        attn = (probs @ v).transpose(0, 1).reshape(t, -1)
        x = x + F.linear(attn, w[p + "self_attn.o_proj.weight"])
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], m.eps)
        gate = F.silu(F.linear(h, w[p + "mlp.gate_proj.weight"]))
        up = F.linear(h, w[p + "mlp.up_proj.weight"])
        x = x + F.linear(gate * up, w[p + "mlp.down_proj.weight"])
    x = rms_norm(x, w["norm.weight"], m.eps)
    return F.linear(x[-1], w["lm_head.weight"]).float()
