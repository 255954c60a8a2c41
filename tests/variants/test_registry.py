"""The registry table: axes in dependency order, conditional axes, every choice has a component."""

import dataclasses

import pytest

from variants.components import (
    ATTENTION,
    CACHES,
    GRAPHS,
    HEADS,
    PREFILL_GRAPHS,
    STACKS,
    Ref,
    assembly_path,
    component_parts,
    model_options,
)
from variants.registry import AXES, AXES_BY_NAME, OPT_IN_AXES
from variants.variant import Variant


def test_one_axis_per_variant_field():
    assert set(AXES_BY_NAME) == {f.name for f in dataclasses.fields(Variant)}
    assert len(AXES) + len(OPT_IN_AXES) == len(AXES_BY_NAME)
    # the searched fields are what a default Variant's dict names (study records, renders)
    assert {a.name for a in AXES} == set(Variant().to_dict())


def test_defaults_are_choices():
    for name, value in dataclasses.asdict(Variant()).items():
        assert value in AXES_BY_NAME[name].values, name


def test_an_axis_depends_only_on_earlier_axes():
    order = [a.name for a in AXES]
    assert order.index("cache") < order.index("block_size")
    assert order.index("attention") < order.index("sdpa_backend")
    assert order.index("execution") < order.index("compile_mode")
    assert order.index("dtype") < order.index("sdpa_backend")  # flash needs the dtype


@pytest.mark.parametrize(
    "axis, partial, applies",
    [
        ("block_size", {"cache": "paged"}, True),
        ("block_size", {"cache": "slab"}, False),
        ("block_size", {"cache": "contiguous"}, False),
        ("sdpa_backend", {"attention": "sdpa"}, True),
        ("sdpa_backend", {"attention": "manual"}, False),
        ("compile_mode", {"execution": "compile"}, True),
        ("compile_mode", {"execution": "eager"}, False),
        ("cache", {}, True),
        ("fuse_qkv", {}, True),
    ],
)
def test_conditional_axes(axis, partial, applies):
    assert AXES_BY_NAME[axis].applies(partial) is applies


def test_every_choice_the_probe_can_offer_has_a_component(fake_cuda_caps):
    """On a GPU machine the search may pick any offered choice; each must be buildable."""
    caps = fake_cuda_caps()
    for cache in caps.choices("cache", {}):
        assert cache in CACHES
        partial = {"cache": cache}
        for attention in caps.choices("attention", partial):
            assert attention in ATTENTION, attention
        for graphs in caps.choices("graphs", partial):
            assert graphs == "off" or graphs in GRAPHS, graphs
    for execution in caps.choices("execution", {}):
        assert execution in ("eager", "compile")
    partial = {"cache": "slab", "attention": "triton", "execution": "eager"}
    assert set(caps.choices("layers", partial)) == set(STACKS)
    assert set(STACKS) == {"torch", "triton", "fused", "fused-pdl"}
    assert "fused-pdl" not in caps.choices("layers", {**partial, "attention": "sdpa"})


@pytest.mark.parametrize(
    "changes, reason",
    [
        ({}, None),
        ({"has_pdl": False}, "compute capability >= 9.0"),  # an RTX 3090, or an older Triton
        ({"device_type": "cpu"}, "CUDA only"),
    ],
)
def test_pdl_layers_are_offered_only_where_the_gpu_and_triton_have_it(
    fake_cuda_caps, changes, reason
):
    caps = fake_cuda_caps(**changes)
    got = caps.why_invalid(Variant(cache="slab", attention="triton", layers="fused-pdl"))
    if reason is None:
        assert got is None
    else:
        assert reason in got


def test_component_parts_follow_the_variant():
    parts = component_parts(Variant(cache="paged", attention="manual", execution="compile"))
    assert parts == {
        "cache_cls": (
            "variants.cache.paged:PagedKVCache",
            {"block_size": 16, "capacity_tokens": 8192},
        ),
        "attention_cls": ("variants.attention.manual:ManualAttention", {}),
        "stack": ("variants.layers.torch_stack:run_torch_stack", {}),
        "wrap": ("variants.execution.compiled:run_compiled", {"mode": "default"}),
    }
    assert model_options(Variant(fuse_qkv=False, dtype="bfloat16")) == {
        "dtype": "bfloat16", "fuse_qkv": False, "fuse_gate_up": True,
    }  # fmt: skip
    # eager wraps nothing; SDPA on PyTorch's choice needs no backend table, a pinned one does
    assert "wrap" not in component_parts(Variant())
    assert component_parts(Variant())["attention_cls"] == (ATTENTION["sdpa"], {})
    pinned = component_parts(Variant(sdpa_backend="math"))["attention_cls"]
    assert pinned == ("variants.attention.sdpa:PinnedSdpaAttention", {"backend": "math"})
    assert component_parts(Variant(cache="slab", layers="triton"))["stack"] == (
        "variants.layers.triton_stack:run_triton_stack",
        {},
    )
    fused = component_parts(
        Variant(cache="slab", attention="triton", layers="fused", graphs="pow2")
    )
    assert fused["stack"][0] == "variants.layers.fused_stack:run_fused_stack"
    assert fused["head"] == (HEADS["fused"], {})
    pdl = component_parts(
        Variant(cache="slab", attention="triton", layers="fused-pdl", graphs="pow2")
    )
    assert pdl["stack"] == ("variants.layers.fused_stack:run_fused_stack", {"pdl": True})
    assert pdl["head"] == ("variants.layers.fused_stack:fused_head", {"pdl": True})
    assert "head" not in component_parts(Variant(cache="slab", layers="triton"))
    # the Triton stacks' graphs read their ids in place and check, clamp and embed them in one
    # kernel; the torch stack's graphs keep torch's ops
    gathered = {"gathered_embedding": Ref("variants.kernels.prompt_gather:gathered_embedding")}
    assert fused["capture"] == (GRAPHS["pow2"], {"policy": "pow2", **gathered})
    assert component_parts(Variant(graphs="every8"))["capture"] == (
        GRAPHS["every8"], {"policy": "every8"}
    )  # fmt: skip
    triton_prefill = component_parts(
        Variant(attention="triton", layers="triton", prefill_graphs="pow2")
    )["capture_prefill"]
    assert triton_prefill == (PREFILL_GRAPHS["pow2"], gathered)
    assert component_parts(Variant(attention="triton", prefill_graphs="pow2"))[
        "capture_prefill"
    ] == (PREFILL_GRAPHS["pow2"], {})


@pytest.mark.parametrize(
    "partial, reason",
    [
        ({"cache": "slab", "attention": "triton", "execution": "eager"}, None),
        ({"cache": "paged", "attention": "triton", "execution": "eager"}, None),
        ({"cache": "slab", "attention": "sdpa", "execution": "eager"}, "Triton attention"),
        ({"cache": "slab", "attention": "triton", "execution": "compile"}, "compile"),
        ({"cache": "contiguous", "attention": "manual"}, "static pool"),
    ],
)
def test_prefill_graphs_need_the_fixed_grid_attention(fake_cuda_caps, partial, reason):
    choice = dict((c.value, c) for c in AXES_BY_NAME["prefill_graphs"].choices)["pow2"]
    got = choice.requires(fake_cuda_caps(), partial)
    assert got is None if reason is None else reason in got


@pytest.mark.parametrize("axis", ["fuse_qkv", "fuse_gate_up"])
def test_fused_layers_need_the_fused_weights(fake_cuda_caps, axis):
    partial = {"cache": "paged", "attention": "triton", "execution": "eager", "layers": "fused"}
    caps = fake_cuda_caps()
    assert caps.choices(axis, partial) == [True]
    assert caps.choices(axis, {**partial, "layers": "triton"}) == [True, False]


def test_flex_is_offered_on_cuda_with_any_cache_and_the_torch_layers(fake_cuda_caps, cpu_caps):
    caps = fake_cuda_caps()
    for cache in ("contiguous", "slab", "paged"):
        assert "flex" in caps.choices("attention", {"cache": cache}), cache
    partial = {"cache": "slab", "attention": "flex"}
    assert caps.choices("execution", partial) == ["eager", "compile"]
    assert caps.choices("layers", {**partial, "execution": "eager"}) == ["torch"]
    assert caps.choices("graphs", partial) == ["off"]
    assert caps.choices("prefill_graphs", partial) == ["off"]
    assert "flex" not in fake_cuda_caps(has_flex=False).choices("attention", {"cache": "slab"})
    # on CPU it is turned away: eager flex there is the manual arithmetic, traced per shape
    assert cpu_caps.why_invalid(Variant(attention="flex")) is not None


PREFIX = {"cache": "paged", "prefix_cache": True}


@pytest.mark.parametrize(
    "changes, reason",
    [
        ({"attention": "sdpa"}, None),
        ({"attention": "manual", "block_size": 64, "fuse_qkv": False}, None),
        ({"cache": "slab"}, "paged cache"),
        ({"cache": "contiguous"}, "paged cache"),
        ({"attention": "triton"}, "sdpa or manual"),
        ({"execution": "compile"}, "eager torch layers"),
        ({"attention": "triton", "layers": "triton"}, "sdpa or manual"),
        ({"graphs": "pow2"}, "without CUDA graphs"),
    ],
)
def test_prefix_cache_only_with_the_paged_eager_torch_assembly(fake_cuda_caps, changes, reason):
    got = fake_cuda_caps().why_invalid(Variant(**{**PREFIX, **changes}))
    assert got is None if reason is None else reason in got, got


def test_prefix_cache_is_opt_in_and_picks_its_cache_and_assembly(cpu_caps):
    """The search walks AXES only: prefix caching is never offered, every searched variant
    keeps it off; a hand-written one is valid and builds its own cache and engine."""
    assert "prefix_cache" not in {a.name for a in AXES}
    variant = Variant(**PREFIX, attention="manual")
    assert cpu_caps.why_invalid(variant) is None
    assert variant.to_dict()["prefix_cache"] is True and "prefix_cache" not in Variant().to_dict()
    assert Variant.from_dict(variant.to_dict()) == variant
    assert variant.name == "paged16/prefix/manual/eager/fused-qkv+gateup/config"
    parts = component_parts(variant)
    assert parts["cache_cls"] == (
        "variants.cache.prefix:PrefixCachedPagedKVCache",
        {"block_size": 16, "capacity_tokens": 8192},
    )
    assert assembly_path(variant) == "variants.prefix_engine:assemble_prefix_caching_engine"
    assert assembly_path(Variant(cache="paged")) == "variants.engine:assemble_engine"
    assert component_parts(Variant(cache="paged"))["cache_cls"][0] == CACHES["paged"]


def test_a_larger_first_cache_is_offered_on_cuda_for_a_pool(cpu_caps, fake_cuda_caps):
    """The first cache's size: larger than the default only where graphs recapture after a move
    (CUDA), and only for the caches with one pool (the contiguous cache has none)."""
    big = Variant(cache="slab", cache_tokens=131072)
    assert "recapture" in cpu_caps.why_invalid(big)
    assert fake_cuda_caps().why_invalid(big) is None
    assert cpu_caps.why_invalid(Variant(cache="paged")) is None
    assert not AXES_BY_NAME["cache_tokens"].applies({"cache": "contiguous"})
    parts = component_parts(Variant(cache="contiguous"))
    assert parts["cache_cls"] == ("variants.cache.contiguous:ContiguousKVCache", {})
