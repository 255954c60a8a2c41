"""Planted fault: RoPE in the rotate-half convention instead of interleaved pairs.

Its own forward pass, otherwise the reference computation.
"""

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from evaluator.engine_loader import load_engine_module  # noqa: E402
from evaluator.reference_model import rms_norm, rope_cos_sin  # noqa: E402

RecomputingEngine = load_engine_module(
    Path(__file__).with_name("reference_engine.py")
).RecomputingEngine


def rope_rotate_half(x, cos, sin):
    # BUG: pairs (x[j], x[j + d/2]) instead of the contract's (x[2j], x[2j+1]).
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


class RopeRotateHalfEngine(RecomputingEngine):
    def last_logits(self, tokens):
        m, w = self.model, self.model.w
        t = len(tokens)
        x = w["embed_tokens.weight"][tokens]
        cos, sin = rope_cos_sin(t, m.head_dim, m.rope_theta, m.compute_dtype, m.device)
        mask = torch.ones(t, t, dtype=torch.bool, device=m.device).triu(1)
        for i in range(m.num_layers):
            p = f"layers.{i}."
            h = rms_norm(x, w[p + "input_layernorm.weight"], m.eps)
            q, k, v = (
                F.linear(h, w[p + f"self_attn.{n}_proj.weight"]).view(t, -1, m.head_dim)
                for n in "qkv"
            )
            q = rope_rotate_half(q.transpose(0, 1), cos, sin)
            k = rope_rotate_half(k.transpose(0, 1), cos, sin)
            group = m.num_heads // m.num_kv_heads
            k = k.repeat_interleave(group, 0)
            v = v.transpose(0, 1).repeat_interleave(group, 0)
            scores = q.float() @ k.float().transpose(-1, -2) / math.sqrt(m.head_dim)
            probs = scores.masked_fill(mask, float("-inf")).softmax(-1).to(m.compute_dtype)
            attn = (probs @ v).transpose(0, 1).reshape(t, -1)
            x = x + F.linear(attn, w[p + "self_attn.o_proj.weight"])
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], m.eps)
            gate = F.silu(F.linear(h, w[p + "mlp.gate_proj.weight"]))
            x = x + F.linear(
                gate * F.linear(h, w[p + "mlp.up_proj.weight"]), w[p + "mlp.down_proj.weight"]
            )
        x = rms_norm(x, w["norm.weight"], m.eps)
        return F.linear(x[-1], w["lm_head.weight"]).float()


def create_engine(model_config, weight_dir, device="cuda"):
    return RopeRotateHalfEngine(model_config, weight_dir, device)
