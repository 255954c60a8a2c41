"""The few-row fused stack and head inside the real engine, run on the CPU by Triton's
interpreter in float32, against the reference: ragged prefill (the Triton stack) and ragged
decode (the fused kernels), eager and through the CUDA-graph body; and the routing by rows."""

import functools

import pytest
import torch

pytest.importorskip("triton")

from variants.attention.manual import ManualAttention  # noqa: E402
from variants.attention.sdpa import SdpaAttention  # noqa: E402
from variants.attention.triton_attention import TritonAttention  # noqa: E402
from variants.cache.paged import PagedKVCache  # noqa: E402
from variants.cache.slab import SlabKVCache  # noqa: E402
from variants.engine import assemble_engine  # noqa: E402
from variants.layers import fused_stack  # noqa: E402
from variants.layers.fused_stack import fused_head, run_fused_stack  # noqa: E402
from variants.variant import Variant  # noqa: E402

CASES = [
    ("slab-triton", SlabKVCache, TritonAttention, Variant(cache="slab", attention="triton")),
    ("paged16-sdpa", PagedKVCache, SdpaAttention, Variant(cache="paged", block_size=16)),
    ("slab-manual", SlabKVCache, ManualAttention, Variant(cache="slab", attention="manual")),
]


def _engine(tiny_config, sharp_weights, cache_cls, attention_cls, variant):
    return assemble_engine(
        tiny_config, sharp_weights, "cpu", cache_cls=cache_cls, attention_cls=attention_cls,
        stack=run_fused_stack, head=fused_head, fuse_qkv=variant.fuse_qkv,
        fuse_gate_up=variant.fuse_gate_up,
    )  # fmt: skip


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-body"])
@pytest.mark.parametrize("name,cache_cls,attention_cls,variant", CASES, ids=[c[0] for c in CASES])
def test_matches_the_reference(name, cache_cls, attention_cls, variant, graphs, tiny_config,
                               sharp_weights, reference_gap, emulate_graphs):  # fmt: skip
    engine = _engine(tiny_config, sharp_weights, cache_cls, attention_cls, variant)
    if graphs:
        emulate_graphs(engine)
    worst = reference_gap(engine)
    assert worst < 1e-4, worst


def test_routes_by_rows(tiny_config, sharp_weights, reference_gap, monkeypatch, count_calls):
    """With the layer limit lowered to 3 rows, the scenario's decode steps of 3, 4, 1 and 4 rows
    take both stacks (the head stays fused up to 64 rows), still exact."""
    monkeypatch.setattr(fused_stack, "FUSED_MAX_ROWS", 3)
    calls = count_calls(fused_stack, ["run_triton_stack", "few_row_linear", "norm_qkv_rope"])
    _, cache_cls, attention_cls, variant = CASES[0]
    engine = _engine(tiny_config, sharp_weights, cache_cls, attention_cls, variant)
    calls.update(dict.fromkeys(calls, 0))  # the warm-up ran every path
    assert reference_gap(engine) < 1e-4
    assert calls == {
        "run_triton_stack": 3,  # the prefill and the two 4-row steps
        "few_row_linear": 2 * 2 * 2 + 5,  # 3- and 1-row steps: 2 layers x 2; 5 heads (prefill too)
        "norm_qkv_rope": 2 * 2,  # 3- and 1-row steps: 2 layers
    }


@pytest.mark.gpu
@pytest.mark.parametrize("layers", ["fused", "fused-pdl"])
@pytest.mark.parametrize("cache", ["slab", "paged"])
def test_gpu_graphed_fused_engine_matches_the_reference(layers, cache, tmp_path,
                                                        graphed_engine_gap):  # fmt: skip
    """The public config in float16 with real CUDA graphs: decode at batches 1, 8 and 16 (the
    fused layers inside the graphs), 32 (fused-pdl's layers, the Triton stack for fused), 64
    (the Triton stack and the fused head inside the graphs) and 65 (past the largest bucket:
    eager, the Triton stack and the torch head). fused-pdl: every fused kernel launched with
    programmatic dependent launch (Hopper only)."""
    if layers == "fused-pdl":
        from variants.kernels.pdl import pdl_supported

        if not (torch.cuda.is_available() and pdl_supported("cuda")):
            pytest.skip("needs compute capability >= 9.0 and a Triton with launch_pdl")
    graphed_engine_gap(layers, cache, tmp_path)


def _plain_pdl_engine(tiny_config, sharp_weights, monkeypatch, pdl=True, knobs=None) -> tuple:
    """A fused-pdl engine (fused with `pdl` False) whose kernels run plain (the CPU has no PDL),
    and the list of (kernel, pdl asked) of every launch of our kernels but the prefill's (which
    take no PDL); `knobs` its few-row table."""
    from variants.attention import triton_attention
    from variants.layers import triton_stack

    asked = []

    def plain(module, name):
        real = getattr(module, name)

        def launch(*args, pdl=False, **kwargs):
            asked.append((name, pdl))
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, launch)

    for name in ("few_row_linear", "norm_qkv_rope", "norm_swiglu"):
        plain(fused_stack, name)
    for name in ("add_rms_norm", "rope_and_cache_write", "silu_mul"):
        plain(triton_stack, name)
    plain(triton_attention, "paged_decode_attention")
    engine = assemble_engine(
        tiny_config, sharp_weights, "cpu", cache_cls=SlabKVCache, attention_cls=TritonAttention,
        stack=functools.partial(fused_stack.run_fused_stack, pdl=pdl, knobs=knobs),
        head=functools.partial(fused_stack.fused_head, pdl=pdl, knobs=knobs),
    )  # fmt: skip
    asked.clear()
    return engine, asked


def test_pdl_stack_asks_every_fused_kernel_for_pdl(tiny_config, sharp_weights, reference_gap,
                                                   monkeypatch):  # fmt: skip
    """fused-pdl's steps and heads launch each fused kernel with pdl=True (here each is run
    plain: the CPU has no PDL); its prefill runs the Triton stack without PDL. The engine still
    matches the reference."""
    engine, asked = _plain_pdl_engine(tiny_config, sharp_weights, monkeypatch)
    assert reference_gap(engine) < 1e-4
    assert set(asked) == {
        ("few_row_linear", True), ("norm_qkv_rope", True), ("norm_swiglu", True),
        ("paged_decode_attention", True),  # the decode steps and the heads
        ("add_rms_norm", False), ("rope_and_cache_write", False), ("silu_mul", False),  # prefill
    }  # fmt: skip


def test_pdl_stack_routes_by_its_own_limit(
    tiny_config, sharp_weights, reference_gap, monkeypatch, count_calls
):
    """fused-pdl keeps decode steps of up to PDL_MAX_ROWS rows on the fused layers, whatever
    FUSED_MAX_ROWS: with the limit at 3 (and FUSED_MAX_ROWS at 1) the scenario's steps of 3 and
    1 rows stay fused and only the two 4-row steps (and the prefill) take the Triton stack."""
    monkeypatch.setattr(fused_stack, "FUSED_MAX_ROWS", 1)
    monkeypatch.setattr(fused_stack, "PDL_MAX_ROWS", 3)
    engine, asked = _plain_pdl_engine(tiny_config, sharp_weights, monkeypatch)
    calls = count_calls(fused_stack, ["run_triton_stack"])
    assert reference_gap(engine) < 1e-4
    assert calls == {"run_triton_stack": 3}
    # The 4-row steps' Triton stack launches its kernels with PDL; the prefill's does not.
    stack = {
        (n, on) for n, on in asked if n in ("add_rms_norm", "rope_and_cache_write", "silu_mul")
    }
    assert stack == {(n, on) for n in ("add_rms_norm", "rope_and_cache_write", "silu_mul")
                     for on in (False, True)}  # fmt: skip


def test_a_table_s_pdl_launches_its_kernel_so_and_the_output_projection_s_the_attention(
    tiny_config, sharp_weights, reference_gap, monkeypatch
):  # fmt: skip
    """The fused layers without PDL, their table asking it of the output projection and the
    head at every row count the scenario's steps reach: those two and the attention before the
    output projection launch with PDL, the QKV, SwiGLU and down kernels without; under fused-pdl
    a table's False turns one kernel's off. The engine still matches the reference."""
    rows = range(1, 17)
    knobs = {(kernel, r): {"pdl": True} for kernel in ("o", "head") for r in rows}
    engine, asked = _plain_pdl_engine(tiny_config, sharp_weights, monkeypatch, False, knobs)
    assert reference_gap(engine) < 1e-4
    fused = {a for a in asked if a[0] in ("norm_qkv_rope", "norm_swiglu", "paged_decode_attention")}
    assert fused == {("norm_qkv_rope", False), ("norm_swiglu", False),
                     ("paged_decode_attention", True)}  # fmt: skip
    # per layer: o with PDL, down without; the heads with
    linear = [pdl for name, pdl in asked if name == "few_row_linear"]
    assert linear.count(True) > linear.count(False) > 0
    knobs = {("swiglu", r): {"pdl": False} for r in rows}
    engine, asked = _plain_pdl_engine(tiny_config, sharp_weights, monkeypatch, True, knobs)
    assert reference_gap(engine) < 1e-4
    assert ("norm_swiglu", False) in asked and ("norm_swiglu", True) not in asked
    assert ("norm_qkv_rope", True) in asked and ("paged_decode_attention", True) in asked
