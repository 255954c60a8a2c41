"""The decoder stack on our fused Triton kernels: residual add + RMSNorm in one kernel, RoPE on
q and k with the cache write in one kernel, silu(gate) * up in one kernel. About 10 launches a
layer instead of ~35, which is what a launch-bound decode step (and a CUDA-graph replay of it)
pays for. Needs CUDA, Triton >= 3.0, fp16/bf16 and a slab or paged pool.

With `pdl` (the fused-pdl layers' decode steps past their row limit, Hopper) each of our
kernels in a decode step launches with programmatic dependent launch: its programs start while
the kernel before finishes and wait there (kernels/pdl.py); the attention must then be ours too.
That takes time off a wide step; a prefill stays without it (slower with it)."""

import torch.nn.functional as F

from variants.kernels.fused_norm import add_rms_norm
from variants.kernels.fused_rope import rope_and_cache_write
from variants.kernels.fused_silu import silu_mul
from variants.layers.projections import project_gate_up, project_qkv
from variants.layers.rmsnorm import rms_norm


def run_triton_stack(model, x, positions, cache, plan, batch, pdl: bool = False):
    """Model.forward's layers; q/k/v biases (Qwen2) and q/k norms (Qwen3) in torch ops."""
    spec = model.spec
    launch = {"pdl": True} if pdl and batch is None else {}
    heads, kv_heads, d, eps = spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.rms_norm_eps
    cos, sin = model.rope.cos, model.rope.sin  # whole tables: the kernel reads `positions`
    delta = None
    for n, w in enumerate(model.weights.layers):
        x, h = add_rms_norm(x, delta, w.input_norm, eps, **launch)
        q, k, v = project_qkv(h, w.qkv, heads * d, kv_heads * d, w.qkv_bias)
        q, k, v = q.view(-1, heads, d), k.view(-1, kv_heads, d), v.view(-1, kv_heads, d)
        if w.q_norm is not None:
            q, k = rms_norm(q, w.q_norm, eps), rms_norm(k, w.k_norm, eps)
        # A prefill attends over its own keys as the cache holds them: rotated (the kernel
        # also packs them by token) and in the pool's dtype.
        k_rot = None if batch is None else k.new_empty(k.shape, dtype=cache.k[n].dtype)
        q = rope_and_cache_write(
            q, k, v, cos, sin, cache.k[n], cache.v[n], plan.write_index,
            k_out=k_rot, positions=positions, **launch,
        )  # fmt: skip
        if batch is not None:
            o = model.attention.prefill(q, k_rot, v.to(cache.v[n].dtype), batch)
        else:
            o = model.attention.decode_from_cache(q, cache, n, plan, **launch)
        x, h = add_rms_norm(x, F.linear(o, w.o), w.post_norm, eps, **launch)
        delta = F.linear(silu_mul(*project_gate_up(h, w.gate_up), **launch), w.down)
    return x + delta
