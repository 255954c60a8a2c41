"""A llama.cpp GGUF file of a LLaMA model as a Hugging Face LLaMA: its config and its weights,
dequantized to float32, under HF's key names and in HF's rotate-half q/k row order.

Needs the `gguf` package (`pip install gguf`). Only `general.architecture == "llama"` with plain
RoPE and no biases: what the engine computes. llama.cpp stores q/k rows interleaved (pairs
(2j, 2j+1) per head); HF pairs (j, j + d/2), so those rows are reordered back here."""

from __future__ import annotations

import numpy as np
import torch

ARCHITECTURE = "llama"

# GGUF tensor name (after `blk.N.`) -> HF name (after `model.layers.N.`).
LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
MODEL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def read_metadata(reader) -> dict:
    """Every key-value field of a `gguf.GGUFReader` as plain Python values."""
    return {name: field.contents() for name, field in reader.fields.items()}


def _float32_value(value: float) -> float:
    """A float32 field as the shortest decimal that reads back to it (9.99999974738e-06 ->
    1e-05), which is how the model's own config wrote it."""
    return float(str(np.float32(value)))


def hf_config(meta: dict, vocab_size: int, tied: bool, torch_dtype: str) -> dict:
    """The HF `config.json` of the model a GGUF's metadata describes."""
    arch = meta.get("general.architecture")
    if arch != ARCHITECTURE:
        raise ValueError(f"general.architecture is {arch!r}; only {ARCHITECTURE!r} is supported")
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise ValueError(f"rope scaling {scaling!r} is not supported (only plain RoPE)")

    def need(key: str):
        if f"{arch}.{key}" not in meta:
            raise ValueError(f"the GGUF metadata lacks {arch}.{key}")
        return meta[f"{arch}.{key}"]

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    rotary = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    if rotary != head_dim:
        raise ValueError(f"RoPE on {rotary} of {head_dim} head dims is not supported")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(need("context_length")),
        "rms_norm_eps": _float32_value(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": _float32_value(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "vocab_size": vocab_size,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tied,
        "torch_dtype": torch_dtype,
    }
    for name, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding")):
        token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None:
            config[f"{name}_token_id"] = int(token_id)
    return config


def hf_tensor_name(name: str) -> str:
    if name in MODEL_TENSORS:
        return MODEL_TENSORS[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}"
    raise ValueError(f"GGUF tensor {name!r} has no place in a LLaMA model (biases, scaled RoPE?)")


def interleaved_to_rotate_half(w: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Rows [heads * head_dim, in]: per head, HF row j <- row 2j and row j + d/2 <- row 2j + 1."""
    rows, cols = w.shape
    return w.view(heads, head_dim // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def expected_shape(hf_name: str, config: dict) -> tuple:
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    table = {
        "embed_tokens": (v, h), "lm_head": (v, h), "norm": (h,), "layernorm": (h,),
        "q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
        "gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i),
    }  # fmt: skip
    kind = hf_name.rsplit(".", 2)[-2]
    return table["layernorm" if kind.endswith("layernorm") else kind]


def hf_state_dict(reader, config: dict, wrap=lambda tensors: tensors) -> dict:
    """Every tensor of the file dequantized to float32 under its HF name, q/k rows rotate-half.
    `wrap` wraps the list of tensors (a progress bar)."""
    from gguf.quants import dequantize

    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    state = {}
    for tensor in wrap(reader.tensors):
        name = hf_tensor_name(tensor.name)
        layer = name.split(".")
        if layer[1] == "layers" and int(layer[2]) >= config["num_hidden_layers"]:
            raise ValueError(f"GGUF tensor {tensor.name!r} is beyond block_count")
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
        if not values.flags.writeable:  # an F32 tensor is a view of the mmapped file
            values = values.copy()
        w = torch.from_numpy(values)
        if tuple(w.shape) != expected_shape(name, config):
            raise ValueError(
                f"GGUF tensor {tensor.name!r} has shape {list(w.shape)}, expected "
                f"{list(expected_shape(name, config))} from the metadata"
            )
        kind = name.rsplit(".", 2)[-2]
        if kind in heads:
            w = interleaved_to_rotate_half(w, heads[kind], config["head_dim"])
        state[name] = w
    missing = sorted(set(hf_tensor_names(config)) - set(state))
    if missing:
        raise ValueError(f"the GGUF file lacks the tensor of {missing[0]}")
    return state


def hf_tensor_names(config: dict) -> list:
    names = [MODEL_TENSORS["token_embd.weight"], MODEL_TENSORS["output_norm.weight"]]
    if not config["tie_word_embeddings"]:
        names.append(MODEL_TENSORS["output.weight"])
    for n in range(config["num_hidden_layers"]):
        names += [f"model.layers.{n}.{hf}" for hf in LAYER_TENSORS.values()]
    return names


def tensor_rows(reader, name: str) -> int | None:
    """The row count (PyTorch order) of tensor `name`, or None when the file lacks it."""
    for tensor in reader.tensors:
        if tensor.name == name:
            return int(tensor.shape[-1])  # GGUF lists dimensions innermost first
    return None
