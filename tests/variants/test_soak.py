"""Long runs and many engines: continuous batching for thousands of operations with results
checked against the reference at sampled steps, the cache pool back to its starting state once
every request is removed, and engines created and dropped without memory creeping up.

The CPU versions run in CI on the tiny model; the GPU versions (public-size model, 10,000
operations, 20 engines, CUDA graphs) run through scripts/gpu_check.sh."""

import gc
import random

import pytest
import torch

from evaluator.reference_model import ReferenceModel
from evaluator.toy_weights import save_toy_weights
from variants import Variant, build_engine


def _free_capacity(cache) -> int:
    if hasattr(cache, "free_slots"):
        return len(cache.free_slots)
    if hasattr(cache, "free_blocks"):
        return len(cache.free_blocks)
    return -len(cache.store)


def soak(engine, ref, vocab: int, max_positions: int, operations: int, check_every: int,
         seed: int = 0) -> dict:  # fmt: skip
    """Random continuous batching: admit, decode all live, retire; returns what was checked."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    device = engine.device
    history: dict = {}
    budget: dict = {}
    next_id, done, checked, worst = 10**6, 0, 0, 0.0
    while done < operations:
        if len(history) < 24 and rng.random() < 0.3:
            ids = [next_id + i for i in range(rng.randint(1, 4))]
            next_id += len(ids)
            prompts = [torch.randint(0, vocab, (rng.randint(1, 48),), generator=gen) for _ in ids]
            out = engine.prefill(ids, [p.to(device) for p in prompts])
            for rid, p in zip(ids, prompts):
                history[rid] = p.tolist()
                budget[rid] = rng.randint(1, min(64, max_positions - len(history[rid])))
        elif history:
            ids = rng.sample(sorted(history), k=rng.randint(1, len(history)))
            tokens = torch.randint(0, vocab, (len(ids),), generator=gen)
            out = engine.decode(ids, tokens.to(device))
            for rid, t in zip(ids, tokens.tolist()):
                history[rid].append(t)
                budget[rid] -= 1
            finished = [r for r in ids if budget[r] <= 0 or len(history[r]) >= max_positions]
            if finished:
                engine.remove(finished)
                done += 1
                for r in finished:
                    del history[r], budget[r]
        else:
            continue
        done += 1
        if ref is not None and done % check_every == 0 and history:
            rows = ids if out.shape[0] == len(ids) else []
            for i, rid in enumerate(rows):
                if rid in history:
                    want = ref.forward(torch.tensor(history[rid], device=ref.device)[None])
                    worst = max(
                        worst, (out[i].cpu() - want[0, -1].float().cpu()).abs().max().item()
                    )
                    checked += 1
    if history:
        engine.remove(sorted(history))
    return {"operations": done, "checked_rows": checked, "max_abs_err": worst}


@pytest.mark.parametrize(
    "variant",
    [Variant(cache="slab"), Variant(cache="paged", block_size=16), Variant(cache="contiguous")],
    ids=lambda v: v.name,
)
def test_cpu_soak_stays_correct_and_returns_the_pool(variant, tiny_config, sharp_weights):
    engine = build_engine(tiny_config, sharp_weights, "cpu", variant)
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    capacity_before = _free_capacity(engine.cache)
    result = soak(engine, ref, tiny_config["vocab_size"], tiny_config["max_position_embeddings"],
                  operations=600, check_every=25)  # fmt: skip
    assert result["operations"] >= 600 and result["checked_rows"] >= 10
    assert result["max_abs_err"] < 1e-4
    assert engine.lengths == {}
    if variant.cache == "contiguous":
        assert engine.cache.store == {}
    else:  # the pool may have grown; every slot or block is free again
        grown = engine.cache.slots if variant.cache == "slab" else engine.cache.blocks - 1
        assert _free_capacity(engine.cache) == grown >= capacity_before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "variant",
    [
        Variant(cache="slab", attention="sdpa", graphs="pow2"),
        Variant(cache="paged", block_size=64, attention="triton", layers="triton", graphs="pow2",
                prefill_graphs="pow2"),
        Variant(cache="paged", block_size=64, attention="triton", layers="fused", graphs="pow2",
                prefill_graphs="pow2"),
    ],
    ids=lambda v: v.name,
)  # fmt: skip
def test_gpu_soak_10k_operations_memory_returns(variant, tmp_path):
    import json
    from pathlib import Path

    gc.collect()  # the previous case's engine must not count against this one
    torch.cuda.empty_cache()
    config = json.loads((Path(__file__).parents[2] / "target/model_config.json").read_text())
    save_toy_weights(config, tmp_path / "model.pt")
    engine = build_engine(config, str(tmp_path), "cuda", variant)
    torch.cuda.synchronize()
    after_create = torch.cuda.memory_allocated()
    ref = ReferenceModel(config, str(tmp_path), "cuda")
    result = soak(engine, ref, config["vocab_size"], config["max_position_embeddings"],
                  operations=10_000, check_every=500)  # fmt: skip
    del ref
    gc.collect()
    torch.cuda.synchronize()
    after_soak = torch.cuda.memory_allocated()
    print(f"soak {variant.name}: {result}, allocated after create {after_create / 2**20:.1f} MiB,"
          f" after soak {after_soak / 2**20:.1f} MiB")  # fmt: skip
    assert result["operations"] >= 10_000 and result["max_abs_err"] < 1e-2 * 2
    assert after_soak <= after_create + 64 * 2**20  # graph pools may keep a little workspace


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_twenty_engines_keep_peak_memory_flat(tmp_path):
    import json
    from pathlib import Path

    gc.collect()
    torch.cuda.empty_cache()
    # What earlier tests of this process left counts here: the split-K arrival counters (one
    # 16 KiB buffer a device, kept for the process) after the fused soak, cuBLAS's workspaces.
    before = torch.cuda.memory_allocated()
    config = json.loads((Path(__file__).parents[2] / "target/model_config.json").read_text())
    save_toy_weights(config, tmp_path / "model.pt")
    variant = Variant(cache="paged", block_size=64, attention="triton", layers="triton",
                      graphs="pow2", prefill_graphs="pow2")  # fmt: skip
    peaks, left = [], []
    for _ in range(20):
        torch.cuda.reset_peak_memory_stats()
        engine = build_engine(config, str(tmp_path), "cuda", variant)
        engine.prefill([1, 2], [torch.arange(1, 100, device="cuda")] * 2)
        engine.decode([1, 2], torch.tensor([5, 6], device="cuda"))
        peaks.append(torch.cuda.max_memory_allocated())
        del engine
        gc.collect()
        torch.cuda.empty_cache()
        left.append(torch.cuda.memory_allocated())
    print("peak MiB per engine:", [round(p / 2**20) for p in peaks])
    print("MiB allocated after each drop:", [round(a / 2**20, 1) for a in left])
    assert max(peaks[5:]) <= peaks[1] * 1.05
    # What outlives every engine: cuBLAS's workspaces, 32 MiB on Hopper per stream it ran on
    # (the default stream and the one capture stream), and nothing more after each engine.
    print("MiB allocated before the first engine:", round(before / 2**20, 3))
    assert left[-1] == left[1] <= before + 2 * 32 * 2**20
