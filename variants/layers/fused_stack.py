"""The decode step on few-row fused kernels: per layer, norm + QKV + RoPE + cache write in one
kernel, attention, the output projection with the residual add in one, norm + gate-up + SiLU-mul
in one, and the down projection with the residual add in one (about 6 launches a layer, against
~10 for the Triton stack and ~35 for torch ops; experiments/decode_step_profile.py counts and
times a step's kernels). The head is norm + projection in one kernel.

Past one 16-row tile the fused layers lose to cuBLAS, which reuses each weight tile better (at
64 rows most of all for norm + QKV + RoPE and the MLP's first half;
experiments/bench_few_row.py), so those calls and prefill run the Triton stack. With PDL and the
L2 prefetch (fused-pdl) they still win at 32 rows, so that stack keeps up to two tiles
(PDL_MAX_ROWS).
Needs CUDA, Triton >= 3.0, fp16/bf16, a slab or paged pool and the fused QKV and gate-up
weights."""

import torch
import torch.nn.functional as F

from variants.kernels.device import device_sm_count
from variants.kernels.few_row_linear import few_row_linear
from variants.kernels.fused_norm import add_rms_norm
from variants.kernels.norm_qkv_rope import norm_qkv_rope
from variants.kernels.norm_swiglu import norm_swiglu
from variants.layers.triton_stack import run_triton_stack

FUSED_MAX_ROWS = 16  # decode steps up to one 16-row tile run the fused layers
# With PDL and the L2 prefetch the fused layers also beat the Triton stack at two 16-row
# tiles, not at 64 rows.
PDL_MAX_ROWS = 32
HEAD_MAX_ROWS = 64  # the fused head wins up to 64 rows (experiments/bench_few_row.py)


def run_fused_stack(
    model, x, positions, cache, plan, batch, pdl: bool = False, knobs: dict | None = None
):
    """`pdl` (fused-pdl): each kernel launched with programmatic dependent launch, so that it
    starts while the kernel before runs and prefetches its weights into L2 (kernels/pdl.py), for
    decode steps of up to PDL_MAX_ROWS rows. Hopper and newer, with the Triton attention.
    `knobs`: (kernel, rows) -> that kernel's `tiles` and `split_k` at a step of that many rows,
    found on this GPU by the autotuner's kernel search, and where it says so its own `pdl`
    (the output projection's also the attention's before it: its programs start while the
    attention runs only when that launches with PDL too); the rules' launch elsewhere."""
    if batch is not None or x.shape[0] > (PDL_MAX_ROWS if pdl else FUSED_MAX_ROWS):
        return run_triton_stack(model, x, positions, cache, plan, batch, pdl=pdl)
    spec = model.spec
    heads, d, eps = spec.num_heads, spec.head_dim, spec.rms_norm_eps
    sms = device_sm_count(model.device)
    cos, sin = model.rope.cos, model.rope.sin  # whole tables: the kernel reads `positions`
    launch = {kernel: {"sm_count": sms, "pdl": pdl} for kernel in ("qkv", "o", "swiglu", "down")}
    for (kernel, rows), found in (knobs or {}).items():
        if rows == x.shape[0] and kernel in launch:
            launch[kernel].update(found)
    attention_pdl = launch["o"]["pdl"]
    for n, w in enumerate(model.weights.layers):
        (qkv,), (gate_up,) = w.qkv, w.gate_up  # the fused weights (the registry requires them)
        q = norm_qkv_rope(
            x, w.input_norm, qkv, eps, d, heads * d, cos, sin, cache.k[n], cache.v[n],
            plan.write_index, positions=positions,
            positions_staged=plan.staged or n > 0,  # layer 0 follows a graph's inputs kernel
            **launch["qkv"],
        )  # fmt: skip
        at = (q.view(-1, heads, d), cache, n, plan)
        o = model.attention.decode_from_cache(*at, pdl=True) if attention_pdl else (
            model.attention.decode_from_cache(*at)
        )  # fmt: skip
        x = few_row_linear(o, w.o, residual=x, **launch["o"])
        act = norm_swiglu(x, w.post_norm, gate_up, eps, **launch["swiglu"])
        x = few_row_linear(act, w.down, residual=x, **launch["down"])
    return x


def fused_head(spec, fallback, pdl: bool = False, knobs: dict | None = None):
    """output_logits(x, norm_w, head_w) as one kernel for up to 64 rows (float32 out, rounded
    through the compute dtype like the reference); more rows go to `fallback`. At a row count
    where the kernel search found cuBLAS faster (a `cublas` entry): our norm kernel, then
    cuBLAS's projection. `pdl`: launched with programmatic dependent launch (the norm, on
    cuBLAS). `knobs`: as run_fused_stack's, its "head" entries (their `pdl` too)."""
    knobs = knobs or {}

    def output_logits(x, norm_w, head_w):
        launch = {"pdl": pdl, **knobs.get(("head", x.shape[0]), {})}
        if x.shape[0] > HEAD_MAX_ROWS:
            return fallback(x, norm_w, head_w)
        if launch.pop("cublas", False):
            _, h = add_rms_norm(x, None, norm_w, spec.rms_norm_eps, pdl=launch["pdl"])
            return F.linear(h, head_w)
        sms = device_sm_count(x.device)
        return few_row_linear(
            x, head_w, norm=norm_w, eps=spec.rms_norm_eps, out_dtype=torch.float32, sm_count=sms,
            **launch,
        )  # fmt: skip

    return output_logits
