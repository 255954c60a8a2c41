"""The one place that reads weights: the course `model.pt`, safetensors (single or sharded) and
Hugging Face LLaMA checkpoints (prefix, tied head, rotate-half q/k rows), checked key by key.

Every expected key and shape is checked and the first problem is named; tensors are cast to the
compute dtype and moved to the device one at a time; QKV and gate-up are concatenated when the
variant fuses them, and the unfused copies are dropped.
"""

import os
from dataclasses import dataclass

import torch

from variants.checkpoint.formats import read_checkpoint
from variants.checkpoint.hf_llama import convert_rotate_half_qk, strip_model_prefix


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: list  # [wqkv] when fused, else [wq, wk, wv]
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: list  # [w_gate_up] when fused, else [w_gate, w_up]
    down: torch.Tensor


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
            tensors += [w.input_norm, *w.qkv, w.o, w.post_norm, *w.gate_up, w.down]
        return sum(t.numel() * t.element_size() for t in tensors)


def expected_shapes(spec) -> dict:
    h, i, v = spec.hidden_size, spec.intermediate_size, spec.vocab_size
    q_rows, kv_rows = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    shapes = {"embed_tokens.weight": (v, h), "norm.weight": (h,), "lm_head.weight": (v, h)}
    for n in range(spec.num_layers):
        p = f"layers.{n}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q_rows, h),
                p + "self_attn.k_proj.weight": (kv_rows, h),
                p + "self_attn.v_proj.weight": (kv_rows, h),
                p + "self_attn.o_proj.weight": (h, q_rows),
                p + "post_attention_layernorm.weight": (h,),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
            }
        )
    return shapes


def uses_rotate_half(spec, path: str, prefixed: bool) -> bool:
    """HF LLaMA checkpoints (config says llama) are rotate-half; the course's `model.pt` with
    unprefixed keys is interleaved by the course contract, whatever the config's model_type."""
    course_file = os.path.basename(path) == "model.pt" and not prefixed
    return spec.rope_layout == "rotate_half" and not course_file


def check_state_dict(spec, state: dict) -> None:
    shapes = expected_shapes(spec)
    for key, shape in shapes.items():
        if key not in state:
            raise KeyError(f"weight {key!r} is missing (expected shape {list(shape)})")
        got = tuple(state[key].shape)
        if got != shape:
            raise ValueError(f"weight {key!r} has shape {list(got)}, expected {list(shape)}")
        if not state[key].dtype.is_floating_point:
            raise ValueError(
                f"weight {key!r} has dtype {state[key].dtype}, expected floating point"
            )
    for key in state:
        if key in shapes:
            continue
        if key.endswith(".bias"):
            raise ValueError(f"weight {key!r} is a bias; layers with biases are not supported")
        parts = key.split(".")
        if parts[0] == "layers" and len(parts) > 1 and parts[1].isdigit():
            if int(parts[1]) >= spec.num_layers:
                raise ValueError(
                    f"weight {key!r} belongs to layer {parts[1]}, but num_hidden_layers is "
                    f"{spec.num_layers}: config and checkpoint disagree"
                )


def course_state_dict(spec, weight_dir: str) -> dict:
    """The checkpoint in the course layout on the CPU: prefix stripped, lm_head tied when the
    config says so or the checkpoint has none, checked, q/k rows in interleaved order."""
    return course_layout(spec, read_checkpoint(weight_dir))


def course_layout(spec, checkpoint) -> dict:
    """`checkpoint`'s tensors in the course layout (its state is handed over)."""
    state, prefixed = strip_model_prefix(checkpoint.state)
    checkpoint.state = None
    if spec.tie_word_embeddings or "lm_head.weight" not in state:
        if "embed_tokens.weight" in state:  # else the check names the missing embedding
            state["lm_head.weight"] = state["embed_tokens.weight"]
    check_state_dict(spec, state)
    if uses_rotate_half(spec, checkpoint.path, prefixed):
        convert_rotate_half_qk(spec, state)
    return state


def load_weights(spec, weight_dir: str, device, dtype, fuse_qkv: bool, fuse_gate_up: bool):
    state = course_state_dict(spec, weight_dir)

    def take(key: str) -> torch.Tensor:
        return state.pop(key).to(device=device, dtype=dtype).contiguous()

    def group(keys: list, fuse: bool) -> list:
        parts = [take(k) for k in keys]
        return [torch.cat(parts, dim=0)] if fuse else parts

    layers = []
    for n in range(spec.num_layers):
        p = f"layers.{n}."
        layers.append(
            LayerWeights(
                input_norm=take(p + "input_layernorm.weight"),
                qkv=group([p + f"self_attn.{x}_proj.weight" for x in "qkv"], fuse_qkv),
                o=take(p + "self_attn.o_proj.weight"),
                post_norm=take(p + "post_attention_layernorm.weight"),
                gate_up=group([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], fuse_gate_up),
                down=take(p + "mlp.down_proj.weight"),
            )
        )
    tied = state["lm_head.weight"] is state["embed_tokens.weight"]
    embed = take("embed_tokens.weight")
    head = embed if tied else take("lm_head.weight")  # tied: one tensor on the device
    weights = ModelWeights(embed=embed, layers=layers, norm=take("norm.weight"), head=head)
    state.clear()
    return weights
