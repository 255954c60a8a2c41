"""Any checkpoint in the course layout: the course `model.pt`, safetensors (single or sharded)
and `.bin` files (formats.py), with the Hugging Face LLaMA conventions undone (hf_llama.py):
the `model.` prefix, a tied head, rotate-half q/k rows."""

import os

from variants.checkpoint.formats import read_checkpoint
from variants.checkpoint.hf_llama import course_layout, strip_model_prefix, uses_rotate_half


def course_state_dict(spec, weight_dir: str) -> dict:
    """The checkpoint in the course layout on the CPU: prefix stripped, lm_head tied when the
    config says so or the checkpoint has none, checked, q/k rows in interleaved order."""
    return course_layout(spec, read_checkpoint(weight_dir))


def weights_format(spec, path: str, state: dict) -> str:
    """The readers an engine written for the weight file at `path` (its tensors, or their
    shapes) needs: "course" when the file is already in the course layout (a `model.pt` with
    unprefixed keys and its own head), "safetensors" for one safetensors file (its layout
    converted as Hugging Face's LLaMA is), else "any" (every format)."""
    _, prefixed = strip_model_prefix(state)
    own_head = "lm_head.weight" in state and not spec.tie_word_embeddings
    plain = os.path.basename(path) == "model.pt" and not prefixed and own_head
    if plain and not uses_rotate_half(spec, path, prefixed):
        return "course"
    return "safetensors" if path.endswith(".safetensors") else "any"
