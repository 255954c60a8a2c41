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
@pytest.mark.parametrize(
    "arch, warps, dtype",
    [("90", 4, "float16"), ("80", 4, "float16"), ("86", 4, "float16"), ("90", 8, "float16"),
     ("90", 4, "bfloat16"), ("86", 4, "bfloat16")],
)  # fmt: skip
def test_compiles_without_spills(arch, warps, dtype):
    report = ptxas_report(COURSE, arch, consumer_warps=warps, dtype=getattr(torch, dtype))
    assert report["spill_bytes"] == 0, report
    assert report["registers"] <= 255, report
    assert report["static_shared_bytes"] + report["dynamic_shared_bytes"] <= SHARED_BYTES[arch]
    assert report["stack_bytes"] <= 64, report  # the watchdog's printf arguments, no arrays


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, tolerance", [("float16", 1e-3), ("bfloat16", 8e-3)])
def test_gpu_step_matches_the_fused_stack(mega_step, dtype, tolerance):
    """The tiny model (GQA, head_dim 32) in each element type: the megakernel's x after a decode
    step of 8 ragged rows is run_fused_stack's within about 8 steps of the type (bfloat16's are
    8x float16's), and 200 more launches (the epoch word alternating the counter banks) give the
    same x bit for bit."""
    from variants.cache.slab import SlabKVCache
    from variants.kernels.device import device_capability, device_sm_count
    from variants.kernels.megakernel import Megakernel, build, step_inputs
    from variants.kernels.megakernel_schedule import build_schedule, validate

    if not torch.cuda.is_available() or device_capability(torch.device("cuda"))[0] < 8:
        pytest.skip("needs a CUDA GPU of compute capability >= 8.0")
    engine, step, fused, *_ = mega_step("cuda", dtype, SlabKVCache)
    assert engine.dtype == getattr(torch, dtype)
    major, minor = device_capability(engine.device)
    shape = MegaShape.from_spec(engine.spec)
    module, ring_slots = build(shape, arch=f"{major}{minor}", dtype=engine.dtype)
    schedule = build_schedule(shape, step[0].shape[0], device_sm_count(engine.device), 4)
    validate(schedule)
    mega = Megakernel(module, schedule, ring_slots, engine.device, split_tokens=16,
                      dtype=engine.dtype)  # fmt: skip
    inputs = step_inputs(engine, *step)
    first = mega(inputs).clone()
    assert (first.float() - fused.float()).abs().max().item() < tolerance
    for _ in range(200):
        out = mega(inputs)
    torch.cuda.synchronize()
    assert torch.equal(out, first) and mega.stuck_task() is None
    # profiled, and polling without sleeping: the same x, every task stamped in phase order
    profiled = Megakernel(module, schedule, ring_slots, engine.device, split_tokens=16,
                          spin_ns=0, profile=True, dtype=engine.dtype)  # fmt: skip
    assert torch.equal(profiled(inputs), first)
    stamps = profiled.stamps.cpu()
    assert (stamps[:, 0] > 0).all() and (stamps.diff(dim=1) >= 0).all()
    summary = profiled.profile()
    assert set(summary["ops"]) == {"QKV", "ATTN", "OPROJ", "GATEUP", "DOWN"}
    assert len(summary["layer_span_us"]) == shape.layers and summary["step_us"] > 0
    # tiles in runs of 4 (one wait and one publication a run): the same x bit for bit
    runs = build_schedule(shape, step[0].shape[0], device_sm_count(engine.device), 4, 4)
    validate(runs)
    grouped = Megakernel(module, runs, ring_slots, engine.device, split_tokens=16,
                         dtype=engine.dtype)  # fmt: skip
    assert torch.equal(grouped(inputs), first) and grouped.stuck_task() is None


def test_profile_summary_splits_each_task_into_its_phases():
    """Stamps planted at known gaps: each op's medians, each layer's span, the blocks' busy
    share and the step come back as planted (ns in, us out)."""
    from variants.kernels.megakernel import profile_summary
    from variants.kernels.megakernel_schedule import build_schedule

    tiny = MegaShape(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=32, inter=128)
    schedule = build_schedule(tiny, rows=8, blocks=4)
    placed = [(block, t) for block, q in enumerate(schedule.queues) for t in q]
    stamps, clock = [], {}
    for block, task in placed:  # on each block: wait 100 ns, weights 200 (none for ATTN), work 300
        start = clock.get(block, 1_000)
        weights = 0 if task.op.name == "ATTN" else 200
        stamps.append([start, start + 100, start + 100 + weights, start + 400 + weights])
        clock[block] = stamps[-1][3]
    summary = profile_summary(placed, stamps)
    ops = summary["ops"]
    assert ops["ATTN"]["weights_us"] == 0 and ops["QKV"]["weights_us"] == 0.2
    assert all(o["wait_us"] == 0.1 and o["work_us"] == 0.3 for o in ops.values())
    assert sum(o["tasks"] for o in ops.values()) == len(placed)
    ends = [row[3] for row in stamps]
    assert summary["step_us"] == round((max(ends) - 1_000) / 1e3, 2)
    assert summary["layer_start_us"][0] == 0 and len(summary["layer_span_us"]) == 2
    busiest = max(sum(1 for b, _ in placed if b == block) for block in clock)
    assert summary["busy_share"]["max"] == round(busiest * 300 / (max(ends) - 1_000), 3)
