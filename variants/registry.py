"""The registry: every axis of the Variant, its choices, and what each choice needs.

One table. The search space, the capability check and the renderer all read it; a new component
joins the product by adding a Choice here (and its module to a table in `components.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

Requirement = Callable[..., "str | None"]


def _always(caps, partial) -> None:
    return None


def _cuda_only(caps, partial) -> str | None:
    return None if caps.cuda else "needs a CUDA device"


def _moves_recapture(caps, partial) -> str | None:
    """A larger first cache spares the moves of a growing pool, which cost most where CUDA
    graphs must capture again after each (on a CPU a move is one copy)."""
    return None if caps.cuda else "a larger first cache pays where CUDA graphs recapture"


def _needs_half(caps, partial) -> str | None:
    if caps.device_type != "cuda":
        return "needs a CUDA device"
    if _resolved_dtype(caps, partial) not in ("float16", "bfloat16"):
        return "needs float16 or bfloat16 compute"
    return None


def _resolved_dtype(caps, partial) -> str:
    dtype = partial.get("dtype", "config")
    if dtype != "config":
        return dtype
    if not caps.cuda:
        return "float32"
    return "bfloat16" if caps.config_dtype == "bfloat16" else "float16"


def _sdpa_backend(name: str) -> Requirement:
    def requires(caps, partial) -> str | None:
        if name not in caps.sdpa_backends:
            return f"SDPA backend {name!r} is not available on {caps.device_type}"
        if name == "flash":
            if caps.head_dim > 256:
                return "flash SDPA supports head_dim <= 256"
            return _needs_half(caps, partial)
        if name == "cudnn":
            return _needs_half(caps, partial)
        return None

    return requires


def _computes(*parts: str, who: str) -> Requirement:
    """Offered only where the model has none of `parts` (probe.MODEL_PARTS), which `who` does
    not compute."""
    names = {
        "qkv_bias": "q/k/v biases",
        "qk_norm": "q/k norms",
        "sliding_window": "a sliding window",
    }

    def requires(caps, partial) -> str | None:
        lacking = [names[p] for p in parts if p in caps.model_parts]
        if not lacking:
            return None
        return f"the model has {' and '.join(lacking)}, not computed by {who}"

    return requires


def _all(*requirements: Requirement) -> Requirement:
    def requires(caps, partial) -> str | None:
        return next((r for r in (q(caps, partial) for q in requirements) if r is not None), None)

    return requires


def _flex(caps, partial) -> str | None:
    """Any cache (it reads the gathered context, like SDPA) and either execution (compile wraps
    the layer math; flex runs eagerly outside it). The Triton layers and CUDA graphs turn it
    away (`_triton_layers`, `_graphs`): neither is checked with it."""
    if not caps.has_flex:
        return "FlexAttention needs torch >= 2.5"
    if not caps.cuda:
        # eager flex on CPU is the manual backend's arithmetic plus a dynamo trace per shape
        return "FlexAttention is offered on CUDA only (on CPU it adds nothing to manual)"
    return None


def _triton(caps, partial) -> str | None:
    if not caps.cuda:
        return "our Triton kernels are offered on CUDA only"
    if caps.triton_version is None or caps.triton_version < (3, 0):
        return "our Triton kernels need triton >= 3.0"
    if caps.head_dim > 256 or caps.head_dim % 2:
        return "our Triton kernels support even head_dim <= 256"
    if partial.get("cache") not in ("slab", "paged"):
        return "our Triton decode kernel reads a slab or paged pool"
    return _needs_half(caps, partial)


def _triton_layers(caps, partial) -> str | None:
    if partial.get("attention") == "flex":
        return "FlexAttention is checked with the torch layers only"
    if partial.get("execution") == "compile":
        return "the fused Triton stack replaces the compiled layer math"
    reason = _triton(caps, partial)
    return None if reason is None else reason.replace("decode kernel", "RoPE + cache kernel")


def _layers_on_triton_attention(why: str) -> Requirement:
    """Triton layers that call our Triton decode attention themselves (`why` says how)."""

    def requires(caps, partial) -> str | None:
        reason = _triton_layers(caps, partial)
        if reason is None and partial.get("attention") != "triton":
            return why
        return reason

    return requires


_fused_layers_on_triton = _layers_on_triton_attention(
    "the PDL layers launch our Triton decode attention between their projections"
)


def _pdl_layers(caps, partial) -> str | None:
    reason = _fused_layers_on_triton(caps, partial)
    if reason is None and not caps.has_pdl:
        return "programmatic dependent launch needs compute capability >= 9.0 and triton >= 3.3"
    return reason


_fused_parts = _computes("qkv_bias", "qk_norm", who="the fused layers")


def _not_with_fused_layers(axis: str) -> Requirement:
    def requires(caps, partial) -> str | None:
        if partial.get("layers") in ("fused", "fused-pdl"):
            return f"the {partial['layers']} layers read the fused {axis} weight"
        return None

    return requires


def _graphs(caps, partial) -> str | None:
    if not caps.cuda:
        return "CUDA graphs need a CUDA device"
    if partial.get("cache") not in ("slab", "paged"):
        return "CUDA graphs need a static pool (slab or paged cache)"
    if partial.get("attention") == "flex":
        return "FlexAttention builds its block mask on each call, not in a captured graph"
    return None


def _prefill_graphs(caps, partial) -> str | None:
    reason = _graphs(caps, partial)
    if reason is not None:
        return reason
    if partial.get("attention") != "triton":
        return "prefill graphs need the Triton attention (its varlen kernel runs on a fixed grid)"
    if partial.get("execution") == "compile":
        return "prefill graphs replay eager kernels (compile would specialise per token bucket)"
    return None


def _prefix_cache(caps, partial) -> str | None:
    if partial.get("cache") != "paged":
        return "prefix caching shares the blocks of the paged cache"
    if partial.get("attention") not in ("sdpa", "manual"):
        return "prefix caching decodes with the sdpa or manual attention"
    if partial.get("layers") != "torch" or partial.get("execution") != "eager":
        return "prefix caching runs a prompt's suffix through the eager torch layers"
    if partial.get("graphs") != "off" or partial.get("prefill_graphs") != "off":
        return "prefix caching runs without CUDA graphs"
    return None


def _compile(caps, partial) -> str | None:
    return None if caps.can_compile else "torch.compile is not usable here"


def _dtype(name: str) -> Requirement:
    def requires(caps, partial) -> str | None:
        if name == "config":
            return None
        if not caps.cuda:
            return "the CPU reference computes in float32; only 'config' is offered on CPU"
        if name == _resolved_dtype(caps, {}):
            return "same as the config dtype"
        if name == "bfloat16" and _resolved_dtype(caps, {}) == "float16":
            # 8 mantissa bits to float16's 11: over tolerance (experiments/calibrate_gate.py)
            return "bfloat16 is less precise than the float16 reference (fails the gate)"
        return None

    return requires


@dataclass(frozen=True)
class Choice:
    value: object
    requires: Requirement = _always


@dataclass(frozen=True)
class Axis:
    name: str
    choices: tuple[Choice, ...]
    applies: Callable[[dict], bool] = field(default=lambda partial: True)

    @property
    def values(self) -> tuple:
        return tuple(c.value for c in self.choices)


AXES: tuple[Axis, ...] = (
    Axis(
        "dtype", tuple(Choice(n, _dtype(n)) for n in ("config", "float32", "bfloat16", "float16"))
    ),
    Axis("cache", (Choice("contiguous"), Choice("slab"), Choice("paged"))),
    Axis(
        "block_size",
        tuple(Choice(n) for n in (16, 32, 64, 128, 256)),
        applies=lambda p: p.get("cache") == "paged",
    ),
    Axis(
        "cache_tokens",
        (Choice(8192), Choice(32768, _moves_recapture), Choice(131072, _moves_recapture)),
        applies=lambda p: p.get("cache") in ("slab", "paged"),
    ),
    Axis(
        "attention",
        (
            Choice("manual"),
            Choice("sdpa"),
            Choice("flex", _all(_flex, _computes("sliding_window", who="FlexAttention here"))),
            Choice(
                "triton", _all(_triton, _computes("sliding_window", who="our Triton attention"))
            ),
        ),
    ),
    Axis(
        "sdpa_backend",
        tuple(Choice(n, _sdpa_backend(n)) for n in ("auto", "flash", "efficient", "math", "cudnn")),
        applies=lambda p: p.get("attention") == "sdpa",
    ),
    Axis("execution", (Choice("eager"), Choice("compile", _compile))),
    Axis(
        "compile_mode",
        (Choice("default"), Choice("max-autotune-no-cudagraphs", _cuda_only)),
        applies=lambda p: p.get("execution") == "compile",
    ),
    Axis(
        "layers",
        (
            Choice("torch"),
            Choice("triton", _triton_layers),
            Choice("fused", _all(_triton_layers, _fused_parts)),
            Choice("fused-pdl", _all(_pdl_layers, _fused_parts)),
        ),
    ),
    Axis("graphs", (Choice("off"), Choice("pow2", _graphs), Choice("every8", _graphs))),
    Axis("prefill_graphs", (Choice("off"), Choice("pow2", _prefill_graphs))),
    Axis("fuse_qkv", (Choice(True), Choice(False, _not_with_fused_layers("QKV")))),
    Axis("fuse_gate_up", (Choice(True), Choice(False, _not_with_fused_layers("gate-up")))),
)

# Axes a Variant sets by hand, checked after AXES; the search walks AXES only and leaves these at
# their defaults (the course's traces share no prompt prefix: prefix caching would measure
# nothing there).
OPT_IN_AXES: tuple[Axis, ...] = (
    Axis(
        "prefix_cache",
        (
            Choice(False),
            Choice(True, _all(_prefix_cache, _computes("sliding_window", who="prefix caching"))),
        ),
    ),
)

AXES_BY_NAME = {axis.name: axis for axis in AXES + OPT_IN_AXES}
