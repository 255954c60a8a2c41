"""Capability probe: what this machine (device, GPU, torch, triton) and this model can run.

The search space is filtered through it, so a trial never starts a component the installed stack
lacks; `why_invalid` rejects a hand-written Variant before anything is built, with the reason.
`resolve_device` checks the device a command names; `UserError` is bad input to any of our
commands (the search's, the sweep's, serving's), here because they all import this layer.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
from dataclasses import dataclass

import torch

from variants import registry
from variants.checkpoint.hf_config import config_dtype_name
from variants.spec import dtype_from_name


class UserError(ValueError):
    """Bad input to a command (a path, config, device or study name): its one-line message names
    the problem and the fix; the command prints it and exits 2 (`--debug`: the traceback)."""


def resolve_device(text: str) -> str:
    """The device a command names (auto: CUDA where torch sees it), checked against this
    machine."""
    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(text)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cuda", "cpu"):
        raise UserError(f"--device must be auto, cpu, cuda or cuda:N, got {text!r}")
    if device.type == "cpu" and device.index is not None:
        raise UserError(f"--device {text}: the CPU takes no index; use --device cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {text}, but torch sees no CUDA device; use --device cpu")
    count = torch.cuda.device_count() if device.type == "cuda" else 0
    if device.type == "cuda" and device.index is not None and device.index >= count:
        raise UserError(f"--device {text}, but torch sees {count} CUDA device(s)")
    return text


def version_tuple(text: str) -> tuple[int, int]:
    major, minor = text.split("+")[0].split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def _triton_version() -> tuple[int, int] | None:
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        import triton

        return version_tuple(triton.__version__)
    except Exception:  # a broken triton install is the same as none
        return None


def _has_pdl(dev: torch.device) -> bool:
    if dev.type != "cuda" or _triton_version() is None:
        return False
    try:
        from variants.kernels.pdl import pdl_supported
    except Exception:  # a Triton too old or broken to import our kernels
        return False
    return pdl_supported(dev)


def _sdpa_backends(device_type: str, capability: tuple[int, int] | None) -> tuple[str, ...]:
    backends = ["auto", "math"]
    if device_type == "cuda":
        backends.append("efficient")
        if capability is not None and capability >= (8, 0):
            backends.append("flash")
            sdpb = getattr(torch.nn.attention, "SDPBackend", None)
            # torch 2.3/2.4 list CUDNN_ATTENTION but call it experimental: offered from 2.5
            stable = version_tuple(torch.__version__) >= (2, 5)
            if stable and hasattr(sdpb, "CUDNN_ATTENTION") and capability >= (9, 0):
                backends.append("cudnn")
    return tuple(backends)


def _can_compile(device_type: str) -> bool:
    try:
        import torch._dynamo

        if not torch._dynamo.is_dynamo_supported():
            return False
    except Exception:
        return False
    # Inductor on CPU writes C++; without a compiler every compiled trial would crash.
    return (
        device_type == "cuda" or shutil.which("g++") is not None or shutil.which("c++") is not None
    )


MODEL_PARTS = ("qkv_bias", "qk_norm", "sliding_window")


@dataclass(frozen=True)
class Capabilities:
    device: str
    device_type: str
    gpu_name: str | None
    compute_capability: tuple[int, int] | None
    torch_version: tuple[int, int]
    triton_version: tuple[int, int] | None
    sdpa_backends: tuple[str, ...]
    has_flex: bool
    has_enable_gqa: bool
    can_compile: bool
    head_dim: int
    config_dtype: str
    has_pdl: bool = False  # programmatic dependent launch of our Triton kernels (kernels/pdl.py)
    # the model's parts beyond LLaMA's that a component must compute to be offered: "qkv_bias",
    # "qk_norm", "sliding_window" (ModelSpec's fields)
    model_parts: tuple = ()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def cuda(self) -> bool:
        return self.device_type == "cuda"

    def choices(self, axis_name: str, partial: dict) -> list:
        """Choices of one axis valid on this machine given the earlier choices in `partial`."""
        axis = registry.AXES_BY_NAME[axis_name]
        return [c.value for c in axis.choices if c.requires(self, partial) is None]

    def why_invalid(self, variant) -> str | None:
        values = dataclasses.asdict(variant)
        partial: dict = {}
        for axis in registry.AXES + registry.OPT_IN_AXES:
            if not axis.applies(partial):
                continue
            value = values[axis.name]
            choice = next((c for c in axis.choices if c.value == value), None)
            if choice is None:
                return f"{axis.name}={value!r} is not a known choice"
            reason = choice.requires(self, partial)
            if reason is not None:
                return f"{axis.name}={value!r}: {reason}"
            partial[axis.name] = value
        return None


def _canonical_dtype(config: dict) -> str:
    """The config's dtype as the engine reads it (variants.spec), by canonical name."""
    try:
        return str(dtype_from_name(config_dtype_name(config))).replace("torch.", "")
    except ValueError:
        return "float16"


def _model_parts(config: dict) -> tuple:
    """The ModelSpec fields of `config` beyond LLaMA's that are set (none where it is not a
    config the engine reads: the pre-flight names what is wrong with it)."""
    from variants.spec import ModelSpec

    try:
        spec = ModelSpec.from_config(config)
    except (ValueError, TypeError):
        return ()
    return tuple(name for name in MODEL_PARTS if getattr(spec, name))


def probe_capabilities(device: str, config: dict | None = None) -> Capabilities:
    dev = torch.device(device)
    capability = name = None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {device!r} asked for, but torch sees no CUDA device")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        capability = tuple(torch.cuda.get_device_capability(index))
        name = torch.cuda.get_device_name(index)
    tv = version_tuple(torch.__version__)
    config = config or {}
    head_dim = int(
        config.get("head_dim")
        or config.get("hidden_size", 0) // max(config.get("num_attention_heads", 1), 1)
    )
    has_flex = (
        tv >= (2, 5) and importlib.util.find_spec("torch.nn.attention.flex_attention") is not None
    )
    return Capabilities(
        device=str(dev),
        device_type=dev.type,
        gpu_name=name,
        compute_capability=capability,
        torch_version=tv,
        triton_version=_triton_version() if dev.type == "cuda" else None,
        sdpa_backends=_sdpa_backends(dev.type, capability),
        has_flex=has_flex,
        has_enable_gqa=tv >= (2, 5),
        can_compile=_can_compile(dev.type),
        head_dim=head_dim,
        config_dtype=_canonical_dtype(config),
        has_pdl=_has_pdl(dev),
        model_parts=_model_parts(config),
    )
