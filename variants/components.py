"""Which module and name implement each choice. The library resolves them by import; the
renderer copies exactly these modules (and what they import from us) into engine.py."""

CORE_MODULES = (
    "variants.spec",
    "variants.variant",
    "variants.weights",
    "variants.staging",
    "variants.requests",
    "variants.layers.rmsnorm",
    "variants.layers.rope",
    "variants.layers.projections",
    "variants.layers.block",
    "variants.cache.plans",
    "variants.attention.padding",
    "variants.engine",
)

# The Triton kernel modules lead a rendered engine, in this order (each after what it imports):
# Triton's cache key holds a kernel's line number, so where two variants render the same kernel
# modules ahead of a kernel, it compiles once for both (scripts/compile_reuse.py). Those that every
# Triton stack uses come first, the fused layers' own last.
KERNEL_ORDER = tuple(
    f"variants.kernels.{name}"
    for name in (
        "device", "pdl", "split_k", "fused_norm", "fused_rope", "fused_silu", "token_check",
        "prompt_gather", "prefill_attention", "decode_attention_rules", "prefetch",
        "decode_attention", "row_dot", "staged_dot", "few_row_linear", "norm_qkv_rope",
        "norm_swiglu",
    )
)  # fmt: skip

# How the engine reads its weights: a module defining course_state_dict(spec, weight_dir). The
# library (and any engine rendered without a target) reads every format; an engine rendered for
# a target whose weights are a course-layout `model.pt` carries only that reader.
WEIGHT_READERS = {
    "any": "variants.checkpoint.reader",
    "course": "variants.checkpoint.course_file",
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
EXECUTION = {
    "eager": "variants.execution.eager:run_eager",
    "compile": "variants.execution.compiled:run_compiled",
}

STACKS = {
    "torch": "variants.layers.torch_stack:run_torch_stack",
    "triton": "variants.layers.triton_stack:run_triton_stack",
    "fused": "variants.layers.fused_stack:run_fused_stack",
    "fused-pdl": "variants.layers.fused_stack:run_fused_pdl_stack",
}
HEADS = {
    "fused": "variants.layers.fused_stack:fused_head",
    "fused-pdl": "variants.layers.fused_stack:fused_pdl_head",
}
# the Triton stacks' graphs check, clamp and embed their ids in one kernel (no copy node)
CHECKS = {
    layers: "variants.kernels.token_check:checked_embedding"
    for layers in ("triton", "fused", "fused-pdl")
}
# and their decode graphs read the call's ids in place, their metadata from pinned memory
GATHERS = dict.fromkeys(CHECKS, "variants.kernels.prompt_gather:gathered_embedding")
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


def assembly_path(variant) -> str:
    """The function that builds the variant's engine from `component_paths`."""
    return ASSEMBLE_PREFIX_CACHING if variant.prefix_cache else ASSEMBLE


def component_paths(variant) -> dict:
    paths = {
        "cache_cls": PREFIX_CACHE if variant.prefix_cache else CACHES[variant.cache],
        "attention_cls": ATTENTION[variant.attention],
        "wrap": EXECUTION[variant.execution],
        "stack": STACKS[variant.layers],
    }
    if variant.layers in HEADS:
        paths["head"] = HEADS[variant.layers]
    if variant.graphs != "off":
        paths["capture"] = GRAPHS[variant.graphs]
    if variant.layers in CHECKS:
        paths["checked_embedding"] = CHECKS[variant.layers]
        paths["gathered_embedding"] = GATHERS[variant.layers]
    if variant.prefill_graphs != "off":
        paths["capture_prefill"] = PREFILL_GRAPHS[variant.prefill_graphs]
    return paths
