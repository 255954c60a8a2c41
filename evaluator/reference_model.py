"""The judge: the course's reference LLaMA-style model, written straight from the contract.

Every request is computed alone over its full history, in float16/bfloat16 on CUDA and float32 on
CPU, or in the dtype asked for (the noise gate's float32/float64 reference). Weights come from
`variants.checkpoint.reader.course_state_dict`, the engines' reader too; nothing else of ours.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from variants.checkpoint.reader import course_state_dict
from variants.spec import ModelSpec


def compute_dtype_for(config: dict, device: str | torch.device) -> torch.dtype:
    """CUDA: float16, or bfloat16 when torch_dtype says so (any case, with or without a
    `torch.` prefix; `dtype` as newer Hugging Face configs write it); anywhere else float32."""
    if torch.device(device).type != "cuda":
        return torch.float32
    name = config.get("torch_dtype") or config.get("dtype") or "float16"
    if str(name).lower().replace("torch.", "") in ("bfloat16", "bf16"):
        return torch.bfloat16
    return torch.float16


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise in float32 (float64 for a float64 reference), cast back, then scale by the
    weight in the compute dtype."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight


def rope_cos_sin(
    seq_len: int, head_dim: int, theta: float, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin `[seq_len, head_dim // 2]` for positions 0..seq_len-1."""
    inv_freq = 1.0 / theta ** (
        torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
    )
    angles = torch.arange(seq_len, dtype=torch.float32, device=device)[:, None] * inv_freq
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (x[2j], x[2j+1]) of `x [..., T, d]` by the angles in cos/sin."""
    pairs = x.unflatten(-1, (-1, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2)


@contextmanager
def exact_float32(device: torch.device) -> Iterator[None]:
    """On CUDA, float32 matmuls in full precision (no TF32) for the duration, whatever an engine
    in this process chose: the contract's float32 scores, and a float32 reference that is one."""
    if device.type != "cuda":
        yield
        return
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)


class ReferenceModel:
    """`dtype` overrides the contract's compute dtype (`compute_dtype_for`): the noise gate's
    float32 or float64 reference, or a float16/bfloat16 reference on the CPU."""

    def __init__(
        self,
        config: dict,
        weight_dir: str | os.PathLike,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
    ):
        spec = ModelSpec.from_config(config)
        self.config = config
        self.device = torch.device(device)
        self.compute_dtype = dtype if dtype is not None else compute_dtype_for(config, self.device)
        self.num_layers = spec.num_layers
        self.num_heads = spec.num_heads
        self.num_kv_heads = spec.num_kv_heads
        self.head_dim = spec.head_dim
        self.eps = spec.rms_norm_eps
        self.rope_theta = spec.rope_theta
        state = course_state_dict(spec, os.fspath(weight_dir))
        self.w = {k: v.to(self.device, self.compute_dtype) for k, v in state.items()}

    def _attention(self, x: torch.Tensor, layer: int, cos, sin) -> torch.Tensor:
        b, t, _ = x.shape
        p = f"layers.{layer}.self_attn."
        q = F.linear(x, self.w[p + "q_proj.weight"]).view(b, t, self.num_heads, self.head_dim)
        k = F.linear(x, self.w[p + "k_proj.weight"]).view(b, t, self.num_kv_heads, self.head_dim)
        v = F.linear(x, self.w[p + "v_proj.weight"]).view(b, t, self.num_kv_heads, self.head_dim)
        q = apply_rope(q.transpose(1, 2), cos, sin)
        k = apply_rope(k.transpose(1, 2), cos, sin)
        v = v.transpose(1, 2)
        group = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        wide = torch.promote_types(self.compute_dtype, torch.float32)  # float32 scores, or float64
        scores = q.to(wide) @ k.to(wide).transpose(-1, -2) / math.sqrt(self.head_dim)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(self.compute_dtype)
        out = (probs @ v).transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)
        return F.linear(out, self.w[p + "o_proj.weight"])

    def _mlp(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        p = f"layers.{layer}.mlp."
        gate = F.silu(F.linear(x, self.w[p + "gate_proj.weight"]))
        up = F.linear(x, self.w[p + "up_proj.weight"])
        return F.linear(gate * up, self.w[p + "down_proj.weight"])

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None):
        """Logits `[B, T, vocab]` in the compute dtype for token ids `[B, T]`; with `positions`
        (1-D indices into T) only those, `[B, len(positions), vocab]`: the output head is the
        largest matmul when the vocabulary is large, and a gate needs few positions."""
        input_ids = input_ids.to(self.device)
        with exact_float32(self.device):
            x = self.w["embed_tokens.weight"][input_ids]
            cos, sin = rope_cos_sin(
                input_ids.shape[1], self.head_dim, self.rope_theta, self.compute_dtype, self.device
            )
            for i in range(self.num_layers):
                h = rms_norm(x, self.w[f"layers.{i}.input_layernorm.weight"], self.eps)
                x = x + self._attention(h, i, cos, sin)
                h = rms_norm(x, self.w[f"layers.{i}.post_attention_layernorm.weight"], self.eps)
                x = x + self._mlp(h, i)
            if positions is not None:
                x = x[:, positions.to(self.device)]
            x = rms_norm(x, self.w["norm.weight"], self.eps)
            return F.linear(x, self.w["lm_head.weight"])

    __call__ = forward
