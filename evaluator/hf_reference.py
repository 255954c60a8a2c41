"""The judge of a Hugging Face folder: transformers' own model of the architecture its config
names, loaded from the folder by `AutoModelForCausalLM` in the dtype asked for (float64 or
float32 for the noise gate's precise reference, the model's dtype for its noise), SDPA attention.
The implementation the model's users already trust; nothing of the engines' code is in it.

Needs `transformers` (run.sh installs it for such a target); without it, or for an architecture
it does not know, `NoReference` says so in one line.
"""

from __future__ import annotations

import inspect
import os

import torch

from evaluator.dtypes import NoReference, compute_dtype_for, exact_float32


def import_transformers():
    try:
        import transformers
    except ImportError:
        raise NoReference(
            "the judge of a Hugging Face folder is transformers' own model, and transformers is "
            "not installed: pip install transformers (run.sh installs it where PyPI is reachable)"
        ) from None
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


def hf_config(config: dict):
    """The config as transformers reads it, for the architecture `model_type` names."""
    transformers = import_transformers()
    model_type = config.get("model_type")
    if model_type not in transformers.CONFIG_MAPPING:
        raise NoReference(
            f"transformers {transformers.__version__} knows no model_type {model_type!r}: the "
            "judge of a Hugging Face folder is transformers' model of the architecture its "
            "config.json names"
        )
    try:
        return transformers.AutoConfig.for_model(
            model_type, **{k: v for k, v in config.items() if k != "model_type"}
        )
    except (ValueError, KeyError, TypeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise NoReference(
            f"transformers {transformers.__version__} cannot read this config of model_type "
            f"{model_type!r}: {first[:200]}"
        ) from None


def transformers_model_class(config: dict) -> type:
    """The class transformers computes this config with (`AutoModelForCausalLM`'s mapping)."""
    transformers = import_transformers()
    mapping = transformers.MODEL_FOR_CAUSAL_LM_MAPPING
    cls = mapping.get(type(hf_config(config)), None)
    if cls is None:
        raise NoReference(
            f"transformers {transformers.__version__} has no causal LM for model_type "
            f"{config.get('model_type')!r}"
        )
    return cls


class TransformersReference:
    """`forward(input_ids [B, T], positions)` -> logits, as `ReferenceModel`'s, computed by
    transformers' model of the folder."""

    def __init__(self, config: dict, weight_dir, device="cpu", dtype: torch.dtype | None = None):
        transformers = import_transformers()
        self.device = torch.device(device)
        self.compute_dtype = dtype if dtype is not None else compute_dtype_for(config, self.device)
        folder = os.fspath(weight_dir)
        # transformers >= 4.56 names the load dtype `dtype`; older ones ignored it then
        new = tuple(int(p) for p in transformers.__version__.split(".")[:2]) >= (4, 56)
        kwargs = {"dtype" if new else "torch_dtype": self.compute_dtype}
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                folder, config=hf_config(config), attn_implementation="sdpa", **kwargs
            )
        except (OSError, ValueError, RuntimeError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise NoReference(f"transformers cannot load the model in {folder}: {first}") from None
        self.model = model.to(self.device).eval()
        params = inspect.signature(self.model.forward).parameters
        self.keeps_positions = "logits_to_keep" in params  # transformers >= 4.50
        if next(self.model.parameters()).dtype != self.compute_dtype:
            raise NoReference(f"transformers loaded {folder} in another dtype than asked")

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None):
        """Logits `[B, T, vocab]` for token ids `[B, T]` at positions 0..T-1; with `positions`
        (1-D indices into T) only those, `[B, len(positions), vocab]`."""
        input_ids = input_ids.to(self.device)
        kwargs = {"use_cache": False}
        if positions is not None and self.keeps_positions:
            kwargs["logits_to_keep"] = positions.to(self.device)
        with exact_float32(self.device):
            logits = self.model(input_ids, **kwargs).logits
        if positions is not None and not self.keeps_positions:
            logits = logits[:, positions.to(self.device)]
        return logits

    __call__ = forward
