"""Every layout returns exactly what was written, at the right positions, for a ragged batch."""

import pytest
import torch

LAYOUTS = ("contiguous", "slab", "paged16", "paged64")
RIDS = (10**9 + 3, 7, 42)
LENGTHS = (5, 16, 33)  # 16 -> 17 crosses a 16-token block boundary on the decode step


def run_layout(make_cache, allocate_plan, append_plan, read_plan, layout):
    gen = torch.Generator().manual_seed(0)
    cache = make_cache(layout, capacity_tokens=64)  # small: the slab and the pool must grow
    total = sum(LENGTHS)
    written = {}  # (layer, rid) -> (k, v) [len, kv_heads, d]
    plan = allocate_plan(cache, RIDS, LENGTHS)
    for layer in range(2):
        k, v = torch.randn(total, 2, 24, generator=gen), torch.randn(total, 2, 24, generator=gen)
        cache.write(layer, plan, k, v)
        start = 0
        for rid, n in zip(RIDS, LENGTHS):
            written[layer, rid] = (k[start : start + n], v[start : start + n])
            start += n
    # One decode step for two of them, in another order.
    step = (42, 10**9 + 3)
    plan = append_plan(cache, step, [LENGTHS[RIDS.index(r)] for r in step])
    for layer in range(2):
        k, v = torch.randn(2, 2, 24, generator=gen), torch.randn(2, 2, 24, generator=gen)
        cache.write(layer, plan, k, v)
        for i, rid in enumerate(step):
            old_k, old_v = written[layer, rid]
            written[layer, rid] = (
                torch.cat([old_k, k[i : i + 1]]),
                torch.cat([old_v, v[i : i + 1]]),
            )
    lens = {rid: written[0, rid][0].shape[0] for rid in RIDS}
    order = (7, 42, 10**9 + 3)
    plan = read_plan(cache, order, [lens[r] for r in order])
    out = {}
    for layer in range(2):
        k, v = cache.read(layer, plan)
        assert k.shape == v.shape == (3, 2, max(lens.values()), 24)
        for i, rid in enumerate(order):
            n = lens[rid]
            out[layer, rid] = (k[i, :, :n].transpose(0, 1), v[i, :, :n].transpose(0, 1))
    return written, out, lens


@pytest.mark.parametrize("layout", LAYOUTS)
def test_write_then_read_returns_what_was_written(
    make_cache, allocate_plan, append_plan, read_plan, layout
):
    written, out, lens = run_layout(make_cache, allocate_plan, append_plan, read_plan, layout)
    assert lens == {10**9 + 3: 6, 7: 16, 42: 34}
    for key, (k, v) in written.items():
        assert torch.equal(out[key][0], k), key
        assert torch.equal(out[key][1], v), key


def test_all_layouts_agree(make_cache, allocate_plan, append_plan, read_plan):
    results = [run_layout(make_cache, allocate_plan, append_plan, read_plan, x)[1] for x in LAYOUTS]
    for other in results[1:]:
        assert other.keys() == results[0].keys()
        for key in results[0]:
            assert torch.equal(other[key][0], results[0][key][0])
            assert torch.equal(other[key][1], results[0][key][1])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_reprefill_after_release_reads_only_the_new_data(
    make_cache, allocate_plan, read_plan, layout
):
    cache = make_cache(layout)
    plan = allocate_plan(cache, [1, 2], [20, 3])
    cache.write(0, plan, torch.full((23, 2, 24), 7.0), torch.full((23, 2, 24), 7.0))
    cache.release(1)
    plan = allocate_plan(cache, [1], [4])
    cache.write(0, plan, torch.full((4, 2, 24), -1.0), torch.full((4, 2, 24), -2.0))
    k, v = cache.read(0, read_plan(cache, [2, 1], [3, 4]))
    assert torch.equal(k[1, :, :4], torch.full((2, 4, 24), -1.0))
    assert torch.equal(v[1, :, :4], torch.full((2, 4, 24), -2.0))
    assert torch.equal(k[0, :, :3], torch.full((2, 3, 24), 7.0))
