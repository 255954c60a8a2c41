"""The capability probe on CPU, and its rules for a GPU machine (Capabilities built by hand)."""

import pytest
import torch

from variants.probe import probe_capabilities, version_tuple
from variants.variant import Variant


@pytest.mark.parametrize(
    "text, expected",
    [("2.13.0+cpu", (2, 13)), ("2.3.0a0+6ddf5cf", (2, 3)), ("3.0.0", (3, 0)), ("2.5.1", (2, 5))],
)
def test_version_tuple(text, expected):
    assert version_tuple(text) == expected


def test_cpu_capabilities(cpu_caps):
    assert cpu_caps.device == "cpu" and not cpu_caps.cuda
    assert cpu_caps.sdpa_backends == ("auto", "math")
    assert cpu_caps.head_dim == 24 and cpu_caps.config_dtype == "float16"
    assert cpu_caps.compute_capability is None and cpu_caps.triton_version is None
    assert cpu_caps.to_dict()["device_type"] == "cpu"


def test_head_dim_defaults_to_hidden_over_heads():
    caps = probe_capabilities("cpu", {"hidden_size": 768, "num_attention_heads": 4})
    assert caps.head_dim == 192


@pytest.mark.parametrize(
    "variant, reason",
    [
        (Variant(attention="sdpa", sdpa_backend="flash"), "sdpa_backend='flash': SDPA backend "),
        (Variant(sdpa_backend="cudnn"), "sdpa_backend='cudnn': SDPA backend 'cudnn' is not avail"),
        (Variant(sdpa_backend="efficient"), "sdpa_backend='efficient': SDPA backend 'efficient'"),
        (Variant(dtype="float16"), "dtype='float16': the CPU reference computes in float32"),
        (Variant(dtype="bfloat16"), "dtype='bfloat16': the CPU reference computes in float32"),
        (Variant(dtype="float32"), "dtype='float32': the CPU reference computes in float32"),
        (Variant(graphs="pow2"), "graphs='pow2': CUDA graphs need a CUDA device"),
        (
            Variant(execution="compile", compile_mode="max-autotune-no-cudagraphs"),
            "compile_mode='max-autotune-no-cudagraphs': needs a CUDA device",
        ),
        (Variant(cache="paged", block_size=48), "block_size=48 is not a known choice"),
        (Variant(cache="ring"), "cache='ring' is not a known choice"),
    ],
)
def test_why_invalid_on_cpu_names_the_axis_and_reason(cpu_caps, variant, reason):
    why = cpu_caps.why_invalid(variant)
    assert why is not None and why.startswith(reason), why
    if "SDPA backend" in reason:
        assert why.endswith("is not available on cpu")


@pytest.mark.parametrize(
    "variant",
    [
        Variant(),
        Variant(cache="paged", block_size=256, attention="manual"),
        Variant(sdpa_backend="math", execution="compile"),
        # Axes that do not apply are not checked: block_size 48 on a slab, flash with manual.
        Variant(cache="slab", block_size=48),
        Variant(attention="manual", sdpa_backend="flash"),
    ],
)
def test_valid_on_cpu(cpu_caps, variant):
    assert cpu_caps.why_invalid(variant) is None


def test_choices_on_cpu_are_conditional(cpu_caps):
    assert cpu_caps.choices("dtype", {}) == ["config"]
    assert cpu_caps.choices("cache", {}) == ["contiguous", "slab", "paged"]
    assert cpu_caps.choices("block_size", {"cache": "paged"}) == [16, 32, 64, 128, 256]
    assert cpu_caps.choices("attention", {"cache": "slab"}) == ["manual", "sdpa"]
    assert cpu_caps.choices("sdpa_backend", {"attention": "sdpa"}) == ["auto", "math"]
    assert cpu_caps.choices("compile_mode", {"execution": "compile"}) == ["default"]
    assert cpu_caps.choices("graphs", {"cache": "slab"}) == ["off"]


def test_enumerated_cpu_variants(all_cpu_variants, cpu_caps):
    """Block size exists only for paged, SDPA backend only for sdpa, compile mode only for
    compile: the enumeration keeps the default of an axis that does not apply."""
    assert all(cpu_caps.why_invalid(v) is None for v in all_cpu_variants)
    eager = [v for v in all_cpu_variants if v.execution == "eager"]
    # caches (contiguous, slab, 5 paged sizes) x (manual, sdpa auto, sdpa math) x 4 fusions
    assert len(eager) == 7 * 3 * 4
    assert len(all_cpu_variants) == 2 * len(eager)
    assert {v.block_size for v in all_cpu_variants if v.cache != "paged"} == {16}
    assert {v.sdpa_backend for v in all_cpu_variants if v.attention != "sdpa"} == {"auto"}
    assert {v.compile_mode for v in all_cpu_variants} == {"default"}


def test_gpu_rules(fake_cuda_caps):
    caps = fake_cuda_caps()
    assert caps.why_invalid(Variant(sdpa_backend="flash")) is None  # float16, head_dim 192
    assert caps.why_invalid(Variant(sdpa_backend="flash", dtype="float32")) == (
        "sdpa_backend='flash': needs float16 or bfloat16 compute"
    )
    assert caps.why_invalid(Variant(dtype="float16")) == "dtype='float16': same as the config dtype"
    assert caps.why_invalid(Variant(dtype="bfloat16")) == (
        "dtype='bfloat16': bfloat16 is less precise than the float16 reference (fails the gate)"
    )
    assert caps.why_invalid(Variant(dtype="float32")) is None
    bf16_model = fake_cuda_caps(config_dtype="bfloat16")
    assert bf16_model.why_invalid(Variant(dtype="float16")) is None
    big = fake_cuda_caps(head_dim=320)
    assert big.why_invalid(Variant(sdpa_backend="flash")) == (
        "sdpa_backend='flash': flash SDPA supports head_dim <= 256"
    )
    assert caps.why_invalid(Variant(cache="contiguous", graphs="pow2")) == (
        "graphs='pow2': CUDA graphs need a static pool (slab or paged cache)"
    )
    assert caps.why_invalid(Variant(cache="paged", graphs="every8")) is None
    ampere = fake_cuda_caps(
        compute_capability=(8, 6), sdpa_backends=("auto", "math", "efficient", "flash")
    )
    assert "not available on cuda" in ampere.why_invalid(Variant(sdpa_backend="cudnn"))
    assert caps.choices("compile_mode", {"execution": "compile"}) == [
        "default",
        "max-autotune-no-cudagraphs",
    ]


@pytest.fixture
def fake_cuda_stack(monkeypatch, tiny_config):
    """probe_capabilities('cuda:0') on this CPU machine with the torch and triton versions faked:
    an sm_90 GPU, `torch.__version__` and an importable `triton` with the given version."""
    import importlib.machinery
    import sys
    import types

    import torch
    import torch._dynamo  # imported before triton is faked

    def probe(torch_version: str, triton_version: str):
        triton = types.ModuleType("triton")
        triton.__version__ = triton_version
        triton.__spec__ = importlib.machinery.ModuleSpec("triton", None)
        monkeypatch.setitem(sys.modules, "triton", triton)
        monkeypatch.setattr(torch, "__version__", torch_version)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "fake sm_90")
        return probe_capabilities("cuda:0", tiny_config)

    return probe


def test_oldest_stack_offers_nothing_it_lacks(fake_cuda_stack):
    """torch 2.3.1 brings triton 2.3.1 (its pip dependency): no FlexAttention, SDPA GQA by
    expansion (no enable_gqa), and none of our Triton kernels (they need triton >= 3.0)."""
    caps = fake_cuda_stack("2.3.1+cu121", "2.3.1")
    assert caps.torch_version == (2, 3) and caps.triton_version == (2, 3)
    assert not caps.has_flex and not caps.has_enable_gqa
    assert caps.choices("attention", {"cache": "slab"}) == ["manual", "sdpa"]
    assert caps.choices("layers", {"cache": "slab"}) == ["torch"]
    assert caps.why_invalid(Variant(cache="slab", attention="triton")) == (
        "attention='triton': our Triton kernels need triton >= 3.0"
    )
    # Triton 3.0 (torch 2.4's) is the first our kernels accept.
    caps = fake_cuda_stack("2.4.0", "3.0.0")
    assert caps.choices("attention", {"cache": "slab"}) == ["manual", "sdpa", "triton"]
    assert not caps.has_flex


@pytest.mark.parametrize("version, offered", [("2.3.1", False), ("2.4.0", False), ("2.5.0", True)])
def test_cudnn_sdpa_offered_from_torch_2_5_on_hopper(monkeypatch, version, offered):
    from variants.probe import _sdpa_backends

    monkeypatch.setattr(torch, "__version__", version)
    assert ("cudnn" in _sdpa_backends("cuda", (9, 0))) is offered
    assert "cudnn" not in _sdpa_backends("cuda", (8, 6))  # Ampere: never
