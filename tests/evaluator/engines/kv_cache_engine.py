"""An honest engine written independently of the reference: a per-request KV cache, fused QKV
and gate/up projections, RoPE rotated in float32, `scaled_dot_product_attention`. It computes the
contract's math in another order, so in float16/bfloat16 its rounding differs from the
reference's: the case the noise gate must pass.
"""

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from evaluator.reference_model import compute_dtype_for  # noqa: E402
from variants.checkpoint.reader import course_state_dict  # noqa: E402
from variants.spec import ModelSpec  # noqa: E402


class KVCacheEngine:
    def __init__(self, model_config: dict, weight_dir: str, device: str = "cuda", dtype=None):
        self.spec = s = ModelSpec.from_config(model_config)
        self.device = torch.device(device)
        self.dtype = dtype if dtype is not None else compute_dtype_for(model_config, device)
        w = {k: v.to(self.device, self.dtype) for k, v in course_state_dict(s, weight_dir).items()}
        self.layers = []
        for i in range(s.num_layers):
            p = f"layers.{i}."
            qkv = [w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]
            gate_up = [w[p + f"mlp.{n}_proj.weight"] for n in ("gate", "up")]
            self.layers.append(
                (
                    w[p + "input_layernorm.weight"],
                    torch.cat(qkv),
                    w[p + "self_attn.o_proj.weight"],
                    w[p + "post_attention_layernorm.weight"],
                    torch.cat(gate_up),
                    w[p + "mlp.down_proj.weight"],
                )
            )
        self.embed, self.norm, self.head = (
            w["embed_tokens.weight"],
            w["norm.weight"],
            w["lm_head.weight"],
        )
        inv_freq = 1.0 / s.rope_theta ** (torch.arange(0, s.head_dim, 2).float() / s.head_dim)
        self.inv_freq = inv_freq.to(self.device)
        self.cache: dict[int, list] = {}  # request id -> per layer [k, v], [kv_heads, T, d]

    def rms_norm(self, x, weight):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.spec.rms_norm_eps)).to(
            self.dtype
        ) * weight

    def rope(self, x, start: int):
        """x [heads, T, d]: rotate interleaved pairs in float32 as complex numbers."""
        t = x.shape[1]
        angles = torch.arange(start, start + t, device=self.device).float()[:, None] * self.inv_freq
        turn = torch.polar(torch.ones_like(angles), angles)
        pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)).contiguous())
        return torch.view_as_real(pairs * turn).flatten(-2).to(self.dtype)

    def forward(self, rid: int, tokens: torch.Tensor) -> torch.Tensor:
        """Append `tokens` to request `rid`; float32 logits `[vocab]` after the last one."""
        s = self.spec
        cache = self.cache.setdefault(rid, [None] * s.num_layers)
        start = 0 if cache[0] is None else cache[0][0].shape[1]
        t = len(tokens)
        x = self.embed[tokens]
        for i, (norm1, wqkv, wo, norm2, wgu, wdown) in enumerate(self.layers):
            q, k, v = F.linear(self.rms_norm(x, norm1), wqkv).split(
                [
                    s.num_heads * s.head_dim,
                    s.num_kv_heads * s.head_dim,
                    s.num_kv_heads * s.head_dim,
                ],
                dim=-1,
            )
            q = self.rope(q.view(t, s.num_heads, s.head_dim).transpose(0, 1), start)
            k = self.rope(k.view(t, s.num_kv_heads, s.head_dim).transpose(0, 1), start)
            v = v.view(t, s.num_kv_heads, s.head_dim).transpose(0, 1)
            if cache[i] is not None:
                k, v = torch.cat([cache[i][0], k], 1), torch.cat([cache[i][1], v], 1)
            cache[i] = [k, v]
            group = s.num_heads // s.num_kv_heads
            mask = torch.ones(t, start + t, dtype=torch.bool, device=self.device).tril(start)
            attn = F.scaled_dot_product_attention(
                q,
                k.repeat_interleave(group, 0),
                v.repeat_interleave(group, 0),
                attn_mask=mask,
            )
            x = x + F.linear(attn.transpose(0, 1).reshape(t, -1), wo)
            gate, up = F.linear(self.rms_norm(x, norm2), wgu).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, wdown)
        return F.linear(self.rms_norm(x[-1], self.norm), self.head).float()

    def prefill(self, request_ids, input_ids):
        rows = []
        for rid, tokens in zip(request_ids, input_ids, strict=True):
            self.cache.pop(int(rid), None)
            rows.append(self.forward(int(rid), tokens.to(self.device)))
        return torch.stack(rows)

    def decode(self, request_ids, token_ids):
        token_ids = token_ids.to(self.device)
        return torch.stack(
            [self.forward(int(rid), token_ids[i : i + 1]) for i, rid in enumerate(request_ids)]
        )

    def remove(self, request_ids):
        for rid in request_ids:
            del self.cache[int(rid)]


def create_engine(model_config: dict, weight_dir: str, device: str = "cuda", dtype=None):
    return KVCacheEngine(model_config, weight_dir, device, dtype)
