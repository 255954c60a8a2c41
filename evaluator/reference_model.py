"""The judge's references. For the course's format (`model_config.json` + `model.pt`) the course's
LLaMA-style model, written straight from the contract, its weights read by the few lines below;
for a Hugging Face folder transformers' own model of its architecture (`hf_reference.py`).
Nothing here shares code with the engines it judges.

Every request is computed alone over its full history, in float16/bfloat16 on CUDA and float32 on
CPU, or in the dtype asked for (the noise gate's float32/float64 reference).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F

# (the judge's dtypes: its callers import them from here too)
from evaluator.dtypes import DTYPES as DTYPES
from evaluator.dtypes import NoReference, compute_dtype_for, exact_float32
from evaluator.dtypes import config_dtype_name as config_dtype_name
from evaluator.dtypes import dtype_named as dtype_named
from evaluator.hf_reference import TransformersReference, transformers_model_class

COURSE_WEIGHTS = "model.pt"


def is_course_format(weight_dir: str | os.PathLike) -> bool:
    """The course's format: its weights are a `model.pt` (the folder's, or that file)."""
    path = Path(weight_dir)
    return path.name == COURSE_WEIGHTS if path.is_file() else (path / COURSE_WEIGHTS).is_file()


def load_reference(config: dict, weight_dir, device="cpu", dtype: torch.dtype | None = None):
    """The reference for a model: the course's math for its format, else transformers' model of
    the folder (`hf_reference.TransformersReference`); raises NoReference with the fix."""
    if is_course_format(weight_dir):
        return ReferenceModel(config, weight_dir, device, dtype)

    return TransformersReference(config, weight_dir, device, dtype)


def check_judgeable(config: dict, weight_dir) -> str:
    """What judges this model, in words, before anything is computed; NoReference when nothing
    can (transformers missing, an architecture it does not know)."""
    if is_course_format(weight_dir):
        course_weights(config, weight_dir)  # names and shapes (memory-mapped: no data read)
        return "the course's reference model (the contract's math, its model.pt)"

    return f"transformers' own {transformers_model_class(config).__name__}"


def course_weights(config: dict, weight_dir) -> dict:
    """The course's `model.pt`: a plain state dict of float tensors, the contract's names and
    shapes (the head tied to the embedding where the config says so)."""
    path = Path(weight_dir)
    path = path if path.is_file() else path / COURSE_WEIGHTS
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise NoReference(f"cannot read {path} as a state dict of tensors ({first})") from None
    if not isinstance(state, dict):
        raise NoReference(f"{path} holds a {type(state).__name__}, not a state dict")
    if config.get("tie_word_embeddings") and "embed_tokens.weight" in state:
        state.setdefault("lm_head.weight", state["embed_tokens.weight"])
    for name, shape in course_shapes(config).items():
        tensor = state.get(name)
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != shape:
            got = list(tensor.shape) if isinstance(tensor, torch.Tensor) else "missing"
            raise NoReference(f"{path}: {name} is {got}, the contract says {list(shape)}")
    return state


def course_sizes(config: dict) -> dict:
    """The contract's keys, with its defaults."""
    heads, hidden = int(config["num_attention_heads"]), int(config["hidden_size"])
    params = config.get("rope_parameters") or {}
    return {
        "layers": int(config["num_hidden_layers"]),
        "heads": heads,
        "kv_heads": int(config.get("num_key_value_heads") or heads),
        "head_dim": int(config.get("head_dim") or hidden // heads),
        "eps": float(config.get("rms_norm_eps", 1e-5)),
        "theta": float(config.get("rope_theta") or params.get("rope_theta") or 10000.0),
    }


def course_shapes(config: dict) -> dict:
    """Every weight's name and shape, as the contract lists them."""
    s, h = course_sizes(config), int(config["hidden_size"])
    v, i = int(config["vocab_size"]), int(config["intermediate_size"])
    q, kv = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    per_layer = {
        "input_layernorm": (h,), "post_attention_layernorm": (h,),
        "self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
        "self_attn.o_proj": (h, q),
        "mlp.gate_proj": (i, h), "mlp.up_proj": (i, h), "mlp.down_proj": (h, i),
    }  # fmt: skip
    shapes = {"embed_tokens.weight": (v, h), "norm.weight": (h,), "lm_head.weight": (v, h)}
    for n in range(s["layers"]):
        shapes |= {f"layers.{n}.{name}.weight": shape for name, shape in per_layer.items()}
    return shapes


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
        sizes = course_sizes(config)
        self.config = config
        self.device = torch.device(device)
        self.compute_dtype = dtype if dtype is not None else compute_dtype_for(config, self.device)
        self.num_layers = sizes["layers"]
        self.num_heads = sizes["heads"]
        self.num_kv_heads = sizes["kv_heads"]
        self.head_dim = sizes["head_dim"]
        self.eps = sizes["eps"]
        self.rope_theta = sizes["theta"]
        state = course_weights(config, weight_dir)
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
