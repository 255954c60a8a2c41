"""A Hugging Face checkpoint in one safetensors file, in the course layout (hf_llama.py: the
`model.` prefix, a tied head, rotate-half q/k rows). An engine rendered for a target whose
weights were such a file reads them this way; one rendered for any other format carries the
reader of every format."""

import os

from variants.checkpoint.formats import Checkpoint, read_safetensors_weights
from variants.checkpoint.hf_llama import course_layout


def safetensors_path(weight_dir: str) -> str:
    """`weight_dir` itself when it is a file, else its `model.safetensors`, else its only
    `.safetensors` file."""
    named = os.path.join(weight_dir, "model.safetensors")
    for path in (weight_dir, named):
        if os.path.isfile(path):
            return path
    found = []
    if os.path.isdir(weight_dir):
        found = sorted(n for n in os.listdir(weight_dir) if n.endswith(".safetensors"))
    if len(found) != 1:
        raise FileNotFoundError(
            f"no weights in {weight_dir}: this engine reads one safetensors file, the format it "
            f"was written for ({len(found)} there); write an engine for these weights (run.sh)"
        )
    return os.path.join(weight_dir, found[0])


def course_state_dict(spec, weight_dir: str) -> dict:
    path = safetensors_path(os.fspath(weight_dir))
    return course_layout(spec, Checkpoint(read_safetensors_weights(path), path))
