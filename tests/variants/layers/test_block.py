"""The layer math around attention equals the reference's layer on one request."""

import math

import torch
import torch.nn.functional as F

from evaluator.reference_model import ReferenceModel, rope_cos_sin
from evaluator.reference_model import apply_rope as reference_apply_rope
from evaluator.reference_model import rms_norm as reference_rms_norm
from variants.layers.block import make_layer_math
from variants.layers.rope import RopeTable
from variants.weights import load_weights


def test_one_layer_and_the_head_match_the_reference(tiny_config, tiny_spec, sharp_weights):
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    w = load_weights(tiny_spec, sharp_weights, "cpu", torch.float32, True, False)
    inputs, outputs, logits = make_layer_math(tiny_spec)
    t = 13
    tokens = torch.randint(0, 256, (t,), generator=torch.Generator().manual_seed(5))
    x = w.embed[tokens]
    rope = RopeTable(24, 512, 10000.0, torch.device("cpu"), torch.float32)
    cos, sin = rope.at(torch.arange(t))
    q, k, v = inputs(x, w.layers[0].input_norm, w.layers[0].qkv, cos, sin)
    assert (q.shape, k.shape, v.shape) == ((t, 4, 24), (t, 2, 24), (t, 2, 24))

    # The reference's layer 0, step by step.
    p = "layers.0.self_attn."
    h = reference_rms_norm(x, ref.w["layers.0.input_layernorm.weight"], 1e-5)
    rc, rs = rope_cos_sin(t, 24, 10000.0, torch.float32, torch.device("cpu"))
    rq = reference_apply_rope(
        F.linear(h, ref.w[p + "q_proj.weight"]).view(t, 4, 24).transpose(0, 1), rc, rs
    )
    rk = reference_apply_rope(
        F.linear(h, ref.w[p + "k_proj.weight"]).view(t, 2, 24).transpose(0, 1), rc, rs
    )
    rv = F.linear(h, ref.w[p + "v_proj.weight"]).view(t, 2, 24).transpose(0, 1)
    assert torch.allclose(q.transpose(0, 1), rq, atol=1e-5)
    assert torch.allclose(k.transpose(0, 1), rk, atol=1e-5)
    assert torch.allclose(v.transpose(0, 1), rv, atol=1e-6)

    kk, vv = rk.repeat_interleave(2, 0), rv.repeat_interleave(2, 0)
    scores = rq @ kk.transpose(-1, -2) / math.sqrt(24)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    o = (scores.softmax(-1) @ vv).transpose(0, 1).reshape(t, 96)
    x1 = outputs(x, o, w.layers[0].o, w.layers[0].post_norm, w.layers[0].gate_up, w.layers[0].down)
    r1 = x + F.linear(o, ref.w[p + "o_proj.weight"])
    r1 = r1 + ref._mlp(
        reference_rms_norm(r1, ref.w["layers.0.post_attention_layernorm.weight"], 1e-5), 0
    )
    assert torch.allclose(x1, r1, atol=1e-5)

    out = logits(x1, w.norm, w.head)
    expected = F.linear(reference_rms_norm(r1, ref.w["norm.weight"], 1e-5), ref.w["lm_head.weight"])
    assert out.shape == (t, 256)
    assert torch.allclose(out, expected, atol=1e-4)
