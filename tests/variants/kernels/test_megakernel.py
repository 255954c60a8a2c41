"""The megakernel's CUDA source: nvcc compiles it for sm_90, sm_80 and sm_86 at the course shape
without spills, its shared memory within each block's limit (skipped without nvcc, as on CI);
and on a GPU, built and run on the tiny model's decode step against run_fused_stack, again and
again on one epoch word (scripts/gpu_check.sh mega)."""

import shutil

import pytest
import torch

from variants.kernels.megakernel import (
    PARAMS,
    SHARED_BYTES,
    kernel_source,
    ptxas_report,
    ring_slots_for,
)
from variants.kernels.megakernel_schedule import MegaShape

COURSE = MegaShape(layers=12, hidden=768, heads=4, kv_heads=4, head_dim=192, inter=3072)


def test_ring_depth_fits_each_gpu():
    """Eight 24 KB slots on sm_90 (the producer about a layer ahead), fewer where a block's
    shared memory is smaller."""
    assert [ring_slots_for(COURSE, arch) for arch in ("90", "80", "86")] == [8, 5, 3]


def test_source_declares_every_param():
    source = kernel_source(COURSE)
    body = source.split("struct Params {")[1].split("};")[0]
    assert [line.split()[-1].rstrip(";") for line in body.strip().splitlines()] == [
        name for name, _ in PARAMS
    ]
    assert f"#define PARAM_WORDS {len(PARAMS)}" in source


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("arch", ["90", "80", "86"])
def test_compiles_without_spills(arch):
    report = ptxas_report(COURSE, arch)
    assert report["spill_bytes"] == 0, report
    assert report["registers"] <= 255, report
    assert report["static_shared_bytes"] + report["dynamic_shared_bytes"] <= SHARED_BYTES[arch]
    assert report["stack_bytes"] <= 64, report  # the watchdog's printf arguments, no arrays


@pytest.mark.gpu
def test_gpu_step_matches_the_fused_stack(mega_step):
    """The tiny model (GQA, head_dim 32) in float16: the megakernel's x after a decode step of
    8 ragged rows is run_fused_stack's within a few float16 steps, and 200 more launches (the
    epoch word alternating the counter banks) give the same x bit for bit."""
    from variants.cache.slab import SlabKVCache
    from variants.kernels.device import device_capability, device_sm_count
    from variants.kernels.megakernel import Megakernel, build, step_inputs
    from variants.kernels.megakernel_schedule import build_schedule, validate

    if not torch.cuda.is_available() or device_capability(torch.device("cuda"))[0] < 8:
        pytest.skip("needs a CUDA GPU of compute capability >= 8.0")
    engine, step, fused, *_ = mega_step("cuda", "float16", SlabKVCache)
    major, minor = device_capability(engine.device)
    shape = MegaShape.from_spec(engine.spec)
    module, ring_slots = build(shape, arch=f"{major}{minor}")
    schedule = build_schedule(shape, step[0].shape[0], device_sm_count(engine.device), 4)
    validate(schedule)
    mega = Megakernel(module, schedule, ring_slots, engine.device, split_tokens=16)
    inputs = step_inputs(engine, *step)
    first = mega(inputs).clone()
    assert (first.float() - fused.float()).abs().max().item() < 1e-3  # ~8 float16 steps of x
    for _ in range(200):
        out = mega(inputs)
    torch.cuda.synchronize()
    assert torch.equal(out, first) and mega.stuck_task() is None
