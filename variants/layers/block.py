"""The math of one decoder layer, split around attention, and the output head.

Attention and the cache write sit between the two halves, so an execution mode (eager,
torch.compile) wraps these plain functions without knowing the cache layout or backend."""

import torch.nn.functional as F

from variants.layers.projections import gated_mlp, project_qkv
from variants.layers.rmsnorm import rms_norm
from variants.layers.rope import apply_rope


def make_layer_math(spec):
    heads, kv_heads, d, eps = spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.rms_norm_eps

    def attention_inputs(x, norm_w, qkv_w, cos, sin, qkv_b=None, q_norm_w=None, k_norm_w=None):
        """q, k (rotated) and v of a layer; `qkv_b`: the projections' biases (Qwen2),
        `q_norm_w` and `k_norm_w`: the per-head norms before RoPE (Qwen3), where it has them."""
        h = rms_norm(x, norm_w, eps)
        q, k, v = project_qkv(h, qkv_w, heads * d, kv_heads * d, qkv_b)
        q, k = q.view(-1, heads, d), k.view(-1, kv_heads, d)
        if q_norm_w is not None:
            q, k = rms_norm(q, q_norm_w, eps), rms_norm(k, k_norm_w, eps)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v.view(-1, kv_heads, d)

    def attention_outputs(x, o, o_w, norm_w, gate_up_w, down_w):
        x = x + F.linear(o, o_w)
        return x + gated_mlp(rms_norm(x, norm_w, eps), gate_up_w, down_w)

    def output_logits(x, norm_w, head_w):
        return F.linear(rms_norm(x, norm_w, eps), head_w)

    return attention_inputs, attention_outputs, output_logits
