"""Which module and name implement each choice. The library resolves them by import; the
renderer copies exactly these modules (and what they import from us) into engine.py."""

from dataclasses import dataclass

CORE_MODULES = (
    "variants.spec",
    "variants.weights",
    "variants.staging",
    "variants.requests",
    "variants.layers.rmsnorm",
    "variants.layers.rope",
    "variants.layers.projections",
    "variants.layers.block",
    "variants.cache.plans",
    "variants.attention.padding",
    "variants.model",
    "variants.engine",
)

# The Triton kernel modules lead a rendered engine, in this order (each after what it imports):
# Triton's cache key holds a kernel's line number, so where two variants render the same kernel
# modules ahead of a kernel, it compiles once for both (experiments/compile_reuse.py). Those that
# every Triton stack uses come first, the fused layers' own last.
KERNEL_ORDER = tuple(
    f"variants.kernels.{name}"
    for name in (
        "device", "pdl", "split_k", "fused_norm", "fused_rope", "fused_silu", "prompt_gather",
        "prefill_attention", "decode_attention_rules", "prefetch", "decode_attention", "row_dot",
        "staged_dot", "few_row_linear", "norm_qkv_rope", "norm_swiglu",
    )
)  # fmt: skip

# How the engine reads its config and weights: the modules defining course_keys(config) and
# course_state_dict(spec, weight_dir). The library (and any engine rendered without a target)
# reads Hugging Face configs and every weight format; an engine rendered for a target in the
# course's own format (its config in the course's keys, its weights a course-layout `model.pt`)
# carries only the course's readers, each in the place of the library's.
READERS = {
    "any": ("variants.checkpoint.hf_config", "variants.checkpoint.reader"),
    "course": ("variants.checkpoint.course_config", "variants.checkpoint.course_file"),
    "safetensors": ("variants.checkpoint.hf_config", "variants.checkpoint.safetensors_file"),
}

CACHES = {
    "contiguous": "variants.cache.contiguous:ContiguousKVCache",
    "slab": "variants.cache.slab:SlabKVCache",
    "paged": "variants.cache.paged:PagedKVCache",
}
ATTENTION = {
    "manual": "variants.attention.manual:ManualAttention",
    "sdpa": "variants.attention.sdpa:SdpaAttention",
    "flex": "variants.attention.flex:FlexAttention",
    "triton": "variants.attention.triton_attention:TritonAttention",
}
# torch.compile of the layer math; eager execution wraps nothing
COMPILE = "variants.execution.compiled:run_compiled"
# SDPA with PyTorch's own choice of backend, or pinned to one (sdpa_backend)
SDPA_PINNED = "variants.attention.sdpa:PinnedSdpaAttention"

STACKS = {
    "torch": "variants.layers.torch_stack:run_torch_stack",
    "triton": "variants.layers.triton_stack:run_triton_stack",
    "fused": "variants.layers.fused_stack:run_fused_stack",
    "fused-pdl": "variants.layers.fused_stack:run_fused_stack",  # bound to pdl=True
}
HEADS = {
    "fused": "variants.layers.fused_stack:fused_head",
    "fused-pdl": "variants.layers.fused_stack:fused_head",  # bound to pdl=True
}
# the Triton stacks' graphs read a call's ids in place and check, clamp and embed them in one
# kernel, their metadata from pinned memory (no copy node)
GATHERS = dict.fromkeys(
    ("triton", "fused", "fused-pdl"), "variants.kernels.prompt_gather:gathered_embedding"
)
GRAPHS = {
    "pow2": "variants.execution.cuda_graphs:use_cuda_graphs",
    "every8": "variants.execution.cuda_graphs:use_cuda_graphs",
}

PREFILL_GRAPHS = {"pow2": "variants.execution.prefill_graphs:use_prefill_graphs"}

# With prefix caching on (registry: paged, eager, torch layers), its cache and the assembly that
# builds the engine subclass whose prefill computes only each prompt's uncached suffix.
PREFIX_CACHE = "variants.cache.prefix:PrefixCachedPagedKVCache"
ASSEMBLE = "variants.engine:assemble_engine"
ASSEMBLE_PREFIX_CACHING = "variants.prefix_engine:assemble_prefix_caching_engine"


@dataclass(frozen=True)
class Ref:
    """An option that is a component (module:name) rather than a value."""

    path: str


@dataclass(frozen=True)
class Table:
    """An option that is data found for this machine: a constant of its own in engine.py,
    under a comment saying what it holds (`about`, a line a string)."""

    name: str
    value: dict
    about: tuple = ()


KNOBS_NAME = "DECODE_ATTENTION_KNOBS"
KNOBS_ABOUT = (
    "The decode attention's launch at each decode graph's (rows, context) bucket, found by",
    "timing it on this GPU at this model's shapes (tuning/decode_attention.py; results.log",
    "says what moved from the rules): paged_decode_attention's options.",
)
FEW_ROW_NAME = "FEW_ROW_KNOBS"
FEW_ROW_ABOUT = (
    "The few-row kernels' launch at a decode step of so many rows where the kernel search",
    "found one faster than the rules on this GPU at this model's shapes (tuning/few_row.py):",
    "(kernel, rows) -> its tiles (BLOCK_N, BLOCK_K, warps, stages), split_k and pdl (launched",
    "with programmatic dependent launch; the output projection's is also the attention's), or",
    "cublas: the head's norm, then cuBLAS's projection.",
)
PREFILL_NAME = "PREFILL_ATTENTION_KNOBS"
PREFILL_ABOUT = (
    "The prefill attention's launch at a prefill graph's token bucket where the kernel search",
    "found one faster than the rules on this GPU at this model's shapes",
    "(tuning/prefill_attention.py): tokens -> its tiles (BLOCK_M, BLOCK_N, warps, stages).",
)


def assembly_path(variant) -> str:
    """The function that builds the variant's engine from `component_parts`."""
    return ASSEMBLE_PREFIX_CACHING if variant.prefix_cache else ASSEMBLE


def model_options(variant) -> dict:
    """The assembly's own options: the compute dtype and the fused projections."""
    return {
        "dtype": variant.dtype,
        "fuse_qkv": variant.fuse_qkv,
        "fuse_gate_up": variant.fuse_gate_up,
    }


def component_parts(
    variant,
    knobs: dict | None = None,
    few_row_knobs: dict | None = None,
    prefill_knobs: dict | None = None,
) -> dict:
    """The assembly's components, each resolved when it is chosen: argument -> (module:name,
    the options it is bound to). The library binds them with functools.partial; the renderer
    writes exactly that, so an engine carries no choice it does not use. `knobs`: the decode
    attention's launch per graph bucket the kernel search found (our Triton attention only);
    `few_row_knobs`: the few-row kernels' launch per (kernel, rows) it found (the fused layers
    and head only); `prefill_knobs`: the prefill attention's per token bucket (our Triton
    attention only)."""
    cache = PREFIX_CACHE if variant.prefix_cache else CACHES[variant.cache]
    sized = {} if variant.cache == "contiguous" else {"capacity_tokens": variant.cache_tokens}
    fused = {"pdl": True} if variant.layers == "fused-pdl" else {}  # the fused layers' options
    if variant.layers in HEADS and few_row_knobs:
        fused["knobs"] = Table(FEW_ROW_NAME, few_row_knobs, FEW_ROW_ABOUT)
    attention = (ATTENTION[variant.attention], {})
    if variant.attention == "triton":
        tables = {"knobs": Table(KNOBS_NAME, knobs, KNOBS_ABOUT)} if knobs else {}
        if prefill_knobs:
            tables["prefill_knobs"] = Table(PREFILL_NAME, prefill_knobs, PREFILL_ABOUT)
        attention = (ATTENTION["triton"], tables)
    if variant.attention == "sdpa" and variant.sdpa_backend != "auto":
        attention = (SDPA_PINNED, {"backend": variant.sdpa_backend})
    parts = {
        "cache_cls": (
            cache,
            {"block_size": variant.block_size, **sized} if variant.cache == "paged" else sized,
        ),
        "attention_cls": attention,
        "stack": (STACKS[variant.layers], fused),
    }
    if variant.execution == "compile":
        parts["wrap"] = (COMPILE, {"mode": variant.compile_mode})
    if variant.layers in HEADS:
        parts["head"] = (HEADS[variant.layers], fused)
    gathered = (
        {"gathered_embedding": Ref(GATHERS[variant.layers])} if variant.layers in GATHERS else {}
    )
    if variant.graphs != "off":
        parts["capture"] = (GRAPHS[variant.graphs], {"policy": variant.graphs, **gathered})
    if variant.prefill_graphs != "off":
        parts["capture_prefill"] = (PREFILL_GRAPHS[variant.prefill_graphs], gathered)
    return parts
