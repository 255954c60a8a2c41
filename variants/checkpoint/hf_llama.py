"""Hugging Face checkpoints (the architectures of hf_config.py) in the course layout, converted
at load time.

Keys lose the `model.` prefix (`lm_head.weight` has none in HF). HF's q/k rows pair dims
(j, j + d/2) per head for rotate-half RoPE; reordering them to pairs (2j, 2j+1) lets the
interleaved RoPE compute the same scores (the inverse of convert_llama_weights_to_hf's permute)."""

import os

import torch

from variants.checkpoint.checks import check_state_dict
from variants.checkpoint.hf_config import architecture_of

HF_PREFIX = "model."


def rope_layout_of(config: dict | None) -> str:
    """How the config's own checkpoints pair the rotary dims: 'rotate_half' (Hugging Face's
    LLaMA) or 'interleaved' (the course's), as the architecture table says."""
    return architecture_of(config or {}).rope_layout


def strip_model_prefix(state: dict) -> tuple:
    """(state with HF's `model.` prefix removed, whether any key had it)."""
    out: dict = {}
    prefixed = False
    for key, tensor in state.items():
        name = key
        if key.startswith(HF_PREFIX):
            name, prefixed = key[len(HF_PREFIX) :], True
        if name in out:
            raise ValueError(f"weight {name!r} appears both with and without the 'model.' prefix")
        out[name] = tensor
    return out, prefixed


def rotate_half_to_interleaved(w: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Rows [heads * head_dim, in]: per head, row 2j <- HF row j and row 2j+1 <- HF row j + d/2."""
    rows, cols = w.shape
    return w.view(heads, 2, head_dim // 2, cols).transpose(1, 2).reshape(rows, cols)


def convert_rotate_half_qk(spec, state: dict) -> None:
    """Reorder every layer's q and k rows in place of the state dict (shapes already checked),
    with their biases and the q/k norm's weight (one head's, shared by all), which follow them."""
    d = spec.head_dim

    def reorder(key: str, heads: int) -> None:
        w = state[key]
        state[key] = rotate_half_to_interleaved(w if w.dim() == 2 else w[:, None], heads, d)
        if w.dim() == 1:
            state[key] = state[key][:, 0]

    for n in range(spec.num_layers):
        p = f"layers.{n}.self_attn."
        for x, heads in (("q", spec.num_heads), ("k", spec.num_kv_heads)):
            reorder(f"{p}{x}_proj.weight", heads)
            if spec.qkv_bias:
                reorder(f"{p}{x}_proj.bias", heads)
            if spec.qk_norm:
                reorder(f"{p}{x}_norm.weight", 1)


def uses_rotate_half(spec, path: str, prefixed: bool) -> bool:
    """HF LLaMA checkpoints (config says llama) are rotate-half; the course's `model.pt` with
    unprefixed keys is interleaved by the course contract, whatever the config's model_type."""
    course_file = os.path.basename(path) == "model.pt" and not prefixed
    return rope_layout_of(spec.config) == "rotate_half" and not course_file


def course_layout(spec, checkpoint) -> dict:
    """`checkpoint`'s tensors (a formats.Checkpoint, its state handed over) in the course
    layout: prefix stripped, lm_head tied when the config says so or the checkpoint has none,
    checked, q/k rows in interleaved order."""
    state, prefixed = strip_model_prefix(checkpoint.state)
    checkpoint.state = None
    if spec.tie_word_embeddings or "lm_head.weight" not in state:
        if "embed_tokens.weight" in state:  # else the check names the missing embedding
            state["lm_head.weight"] = state["embed_tokens.weight"]
    check_state_dict(spec, state)
    if uses_rotate_half(spec, checkpoint.path, prefixed):
        convert_rotate_half_qk(spec, state)
    return state
