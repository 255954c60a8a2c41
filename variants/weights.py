"""The model's weights on the device: the checkpoint in the course layout (checkpoint/: every
key and shape checked, the first problem named), each tensor cast to the compute dtype and moved
one at a time; QKV and gate-up concatenated when the variant fuses them, the unfused copies
dropped.
"""

from dataclasses import dataclass

import torch

from variants.checkpoint.reader import course_state_dict


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: list  # [wqkv] when fused, else [wq, wk, wv]
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: list  # [w_gate_up] when fused, else [w_gate, w_up]
    down: torch.Tensor
    qkv_bias: list | None = None  # as qkv, where the model has them (spec.qkv_bias)
    q_norm: torch.Tensor | None = None  # [head_dim], where the model has them (spec.qk_norm)
    k_norm: torch.Tensor | None = None

    def tensors(self) -> list:
        optional = [*(self.qkv_bias or []), self.q_norm, self.k_norm]
        return [self.input_norm, *self.qkv, self.o, self.post_norm, *self.gate_up, self.down] + [
            t for t in optional if t is not None
        ]


@dataclass
class ModelWeights:
    embed: torch.Tensor
    layers: list
    norm: torch.Tensor
    head: torch.Tensor

    def nbytes(self) -> int:
        """Bytes of every tensor, a tied head counted once."""
        tensors = [self.embed, self.norm, *([] if self.head is self.embed else [self.head])]
        for w in self.layers:
            tensors += w.tensors()
        return sum(t.numel() * t.element_size() for t in tensors)


def load_weights(spec, weight_dir: str, device, dtype, fuse_qkv: bool, fuse_gate_up: bool):
    state = course_state_dict(spec, weight_dir)

    def take(key: str) -> torch.Tensor:
        return state.pop(key).to(device=device, dtype=dtype).contiguous()

    def group(keys: list, fuse: bool) -> list:
        parts = [take(k) for k in keys]
        return [torch.cat(parts, dim=0)] if fuse else parts

    def layer(p: str) -> LayerWeights:  # p: the layer's key prefix
        return LayerWeights(
            input_norm=take(p + "input_layernorm.weight"),
            qkv=group([p + f"self_attn.{x}_proj.weight" for x in "qkv"], fuse_qkv),
            o=take(p + "self_attn.o_proj.weight"),
            post_norm=take(p + "post_attention_layernorm.weight"),
            gate_up=group([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], fuse_gate_up),
            down=take(p + "mlp.down_proj.weight"),
            qkv_bias=group([p + f"self_attn.{x}_proj.bias" for x in "qkv"], fuse_qkv)
            if spec.qkv_bias else None,
            q_norm=take(p + "self_attn.q_norm.weight") if spec.qk_norm else None,
            k_norm=take(p + "self_attn.k_norm.weight") if spec.qk_norm else None,
        )  # fmt: skip

    layers = [layer(f"layers.{n}.") for n in range(spec.num_layers)]
    tied = state["lm_head.weight"] is state["embed_tokens.weight"]
    embed = take("embed_tokens.weight")
    head = embed if tied else take("lm_head.weight")  # tied: one tensor on the device
    weights = ModelWeights(embed=embed, layers=layers, norm=take("norm.weight"), head=head)
    state.clear()
    return weights
