"""Any checkpoint in the course layout: the course `model.pt`, safetensors (single or sharded)
and `.bin` files (formats.py), with the Hugging Face LLaMA conventions undone (hf_llama.py):
the `model.` prefix, a tied head, rotate-half q/k rows."""

import os

from variants.checkpoint.checks import check_state_dict
from variants.checkpoint.formats import read_checkpoint
from variants.checkpoint.hf_llama import (
    convert_rotate_half_qk,
    rope_layout_of,
    strip_model_prefix,
)


def uses_rotate_half(spec, path: str, prefixed: bool) -> bool:
    """HF LLaMA checkpoints (config says llama) are rotate-half; the course's `model.pt` with
    unprefixed keys is interleaved by the course contract, whatever the config's model_type."""
    course_file = os.path.basename(path) == "model.pt" and not prefixed
    return rope_layout_of(spec.config) == "rotate_half" and not course_file


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


def weights_format(spec, path: str, state: dict) -> str:
    """ "course" when the weight file at `path` (its tensors, or their shapes) is already in the
    course layout, so that reading it needs none of the conversions: a `model.pt` with
    unprefixed keys and its own head; else "any"."""
    _, prefixed = strip_model_prefix(state)
    own_head = "lm_head.weight" in state and not spec.tie_word_embeddings
    plain = os.path.basename(path) == "model.pt" and not prefixed and own_head
    return "course" if plain and not uses_rotate_half(spec, path, prefixed) else "any"
