"""The Triton stack with its norms folded into the projections: no add + RMSNorm kernel.

RMSNorm(x) @ W.T = (1 / rms(x)) * (x @ (W * g).T) row by row, for the norm's weight g. So with
the weights of QKV and gate-up loaded as W * g (weights.py), a layer projects the residual stream
itself, and the kernels right after those projections (RoPE + cache write, SiLU-mul) scale their
inputs by each row's 1 / rms, which they read from the stream. The residual adds go into cuBLAS's
epilogue (`addmm_`, in place). A layer is seven launches instead of nine. What it costs: the
projections see the stream unnormalised (their outputs are rms(x) times larger before the scale,
which float16 holds only while rms(x) * |output| < 65504), and the products round in another
order than the reference's, which the correctness gate measures like any other variant's.

Measured on the H200 (docs/PERF.md, run 190), with the norms simply removed: prefill -3.1%,
mixed -4.6%, wide_decode -6.6%, continuous -1.1%."""

import torch

from variants.kernels.fused_rope import rope_and_cache_write
from variants.kernels.fused_silu import silu_mul
from variants.layers.projections import project_gate_up, project_qkv


def run_folded_stack(engine, x, positions, plan, batch, launch: dict):
    """The layers over x (fresh and contiguous, updated in place) with the folded weights
    (`LayerWeights.qkv_folded`, `gate_up_folded`); `launch` as run_triton_stack's."""
    spec, cache = engine.spec, engine.cache
    heads, kv_heads, d, eps = spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.rms_norm_eps
    cos, sin = engine.rope.cos, engine.rope.sin  # whole tables: the kernel reads `positions`
    x = x.contiguous()
    for n, w in enumerate(engine.weights.layers):
        q, k, v = project_qkv(x, w.qkv_folded, heads * d, kv_heads * d)
        k, v = k.view(-1, kv_heads, d), v.view(-1, kv_heads, d)
        # a prefill attends over its keys and values as the kernel scaled them (and rotated k)
        k_rot = None if batch is None else k.new_empty(k.shape, dtype=cache.k[n].dtype)
        v_scaled = None if batch is None else torch.empty_like(k_rot)
        q = rope_and_cache_write(
            q.view(-1, heads, d), k, v, cos, sin, cache.k[n], cache.v[n], plan.write_index,
            k_out=k_rot, positions=positions, norm_x=x, eps=eps, v_out=v_scaled, **launch,
        )  # fmt: skip
        if batch is not None:
            o = engine.attention.prefill(q, k_rot, v_scaled, batch)
        else:
            o = engine.attention.decode_from_cache(q, cache, n, plan, **launch)
        x.addmm_(o.reshape(x.shape[0], -1), w.o.t())
        gate, up = project_gate_up(x, w.gate_up_folded)
        x.addmm_(silu_mul(gate, up, norm_x=x, eps=eps, **launch), w.down.t())
    return x
