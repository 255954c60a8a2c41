"""Presets: all valid here, the fastest expected first, the safest last."""

import dataclasses

from variants.presets import PRESETS, ranked_defaults
from variants.variant import Variant


def test_ranked_defaults_on_cpu_are_all_valid_and_safest_last(cpu_caps):
    ranked = ranked_defaults(cpu_caps)
    assert ranked and all(cpu_caps.why_invalid(v) is None for v in ranked)
    assert ranked[0] == PRESETS["slab-sdpa"]  # the GPU-only presets are dropped on a CPU
    assert ranked[-1] == PRESETS["safest"]
    assert ranked[-1].attention == "manual" and ranked[-1].execution == "eager"
    assert not ranked[-1].fuse_qkv and not ranked[-1].fuse_gate_up
    assert ranked == [v for v in PRESETS.values() if v in ranked]  # order kept
    assert len({v.name for v in ranked}) == len(ranked)


def test_presets_the_machine_cannot_run_are_dropped(cpu_caps):
    no_compiler = dataclasses.replace(cpu_caps, can_compile=False)
    ranked = ranked_defaults(no_compiler)
    assert ranked and all(v.execution == "eager" for v in ranked)
    runnable = [v for v in PRESETS.values() if no_compiler.why_invalid(v) is None]
    assert ranked == runnable
    assert PRESETS["slab-triton-fused-graphs"] not in ranked  # CUDA only
    assert all(isinstance(v, Variant) for v in ranked)


def test_the_pdl_preset_leads_on_hopper_and_is_dropped_elsewhere(fake_cuda_caps):
    hopper = ranked_defaults(fake_cuda_caps())
    assert hopper[0] == PRESETS["slab-triton-pdl-allgraphs"]
    assert hopper[1] == PRESETS["slab-triton-gemv-allgraphs"]
    rtx3090 = ranked_defaults(fake_cuda_caps(compute_capability=(8, 6), has_pdl=False))
    assert PRESETS["slab-triton-pdl-allgraphs"] not in rtx3090
    assert rtx3090[0] == PRESETS["slab-triton-gemv-allgraphs"]
