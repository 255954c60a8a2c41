"""The judge's dtypes, and its one-line refusal: what the references and the gates share with the
reference loader (`hf_reference.py` and `reference_model.py` both import it; neither imports the
other's module at its top)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

DTYPES = {"float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
DTYPES |= {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
DTYPES |= {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32}


class NoReference(ValueError):
    """The judge cannot build a reference for this model; the message is one line and the fix."""


def dtype_named(name) -> torch.dtype:
    """A config's or a flag's dtype name (`torch.` prefix and case ignored)."""
    key = str(name).replace("torch.", "").lower()
    if key not in DTYPES:
        raise ValueError(f"unsupported dtype {name!r}; expected one of {sorted(DTYPES)}")
    return DTYPES[key]


def config_dtype_name(config: dict) -> str:
    """`torch_dtype`, or `dtype` as transformers >= 4.56 writes it; float16 when neither."""
    for key in ("torch_dtype", "dtype"):
        if config.get(key) is not None:
            return str(config[key])
    return "float16"


def compute_dtype_for(config: dict, device: str | torch.device) -> torch.dtype:
    """CUDA: float16, or bfloat16 when torch_dtype says so (any case, with or without a
    `torch.` prefix; `dtype` as newer Hugging Face configs write it); anywhere else float32."""
    if torch.device(device).type != "cuda":
        return torch.float32
    if config_dtype_name(config).lower().replace("torch.", "") in ("bfloat16", "bf16"):
        return torch.bfloat16
    return torch.float16


@contextmanager
def exact_float32(device: torch.device) -> Iterator[None]:
    """On CUDA, float32 matmuls in full precision (no TF32) for the duration, whatever an engine
    in this process chose: the contract's float32 scores, and a float32 reference that is one."""
    if device.type != "cuda":
        yield
        return
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)
