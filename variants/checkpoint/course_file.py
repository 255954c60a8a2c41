"""The course's own checkpoint: `model.pt`, a plain state dict already in the course layout
(unprefixed keys, its own `lm_head`, interleaved q/k rows), read with `weights_only=True` and
checked key by key. An engine rendered for a target whose weights were such a file reads them
this way; one rendered for any other format carries the reader of every format."""

import os

import torch

from variants.checkpoint.checks import check_state_dict


def course_state_dict(spec, weight_dir: str) -> dict:
    path = os.path.join(weight_dir, "model.pt") if os.path.isdir(weight_dir) else weight_dir
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds a {type(state).__name__}, expected a state dict")
    check_state_dict(spec, state)
    return state
