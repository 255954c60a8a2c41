"""CUDA-graph prefill: token buckets, and the captured body (fixed-grid attention, padding tokens
on the scratch slot) run on the CPU by Triton's interpreter, each "graph" replaying the body
eagerly on the static buffers. Real capture against the reference: the gpu test at the end."""

import gc
import weakref

import pytest
import torch

pytest.importorskip("triton")

from evaluator.reference_model import ReferenceModel  # noqa: E402
from variants import Variant, build_engine  # noqa: E402
from variants.attention.triton_attention import TritonAttention  # noqa: E402
from variants.cache.paged import PagedKVCache  # noqa: E402
from variants.cache.slab import SlabKVCache  # noqa: E402
from variants.engine import assemble_engine  # noqa: E402
from variants.execution.prefill_graphs import PrefillGraphs  # noqa: E402
from variants.layers.torch_stack import run_torch_stack  # noqa: E402
from variants.layers.triton_stack import run_triton_stack  # noqa: E402


class _EagerReplay:
    def __init__(self, body, arg):
        self.body, self.arg = body, arg

    def replay(self):
        self.body(self.arg)


def _emulated(engine, largest_tokens, most_prompts, check_ids=None, gathered_embedding=None):
    """`check_ids` False: the check of the ids left to the engine, as where PyTorch cannot
    capture it (DeferredRangeCheck.in_graph)."""
    if check_ids is not None:
        engine.token_check.in_graph = check_ids
    graphs = PrefillGraphs(
        engine, largest_tokens=largest_tokens, most_prompts=most_prompts,
        gathered_embedding=gathered_embedding,
    )  # fmt: skip
    graphs.captured = []

    def capture_one(t, warm_up=True):
        if warm_up:  # a capture runs the body once, on padding metadata, before capturing it
            graphs._fill([], [], t)
            graphs._body(t)
        graphs.graphs[t] = _EagerReplay(graphs._body, t)
        graphs.captured.append(t)

    graphs._capture_bucket = capture_one
    graphs.generation = engine.cache.generation
    for t in reversed(graphs.buckets):
        capture_one(t, warm_up=False)
    graphs.heads = {m: _EagerReplay(graphs._head, m) for m in graphs.head_rows}
    engine.prefill_runner = graphs
    return graphs


CASES = [
    ("slab-torch-stack", SlabKVCache, run_torch_stack, Variant(cache="slab", attention="triton")),
    ("paged16-triton-stack", PagedKVCache, run_triton_stack,
     Variant(cache="paged", block_size=16, attention="triton", layers="triton")),
]  # fmt: skip


# Padding tokens attend to nothing: their rows hold whatever the output buffer held, which can
# overflow in later layers. Those rows reach no logits and only the scratch slot (checked here).
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("name,cache_cls,stack,variant", CASES, ids=[c[0] for c in CASES])
def test_bucketed_prefill_matches_reference_and_leaves_live_state(
    name, cache_cls, stack, variant, tiny_config, sharp_weights
):
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    engine = assemble_engine(
        tiny_config, sharp_weights, "cpu", cache_cls=cache_cls, attention_cls=TritonAttention,
        stack=stack,
    )  # fmt: skip
    graphs = _emulated(engine, largest_tokens=256, most_prompts=3)
    gen = torch.Generator().manual_seed(11)
    vocab = tiny_config["vocab_size"]
    history: dict = {}
    worst = 0.0
    # 40 tokens pad to 64; 4 prompts exceed the table (eager); 300 tokens exceed the largest
    # bucket (eager); a re-prefill of 7 replaces it; 256 tokens fill a bucket exactly
    calls = [
        {7: 5, 3: 34, 11: 1},
        {900: 20, 12: 3, 13: 4, 14: 5},
        {21: 150, 22: 150},
        {7: 9},
        {30: 200, 31: 56},
    ]
    for call in calls:
        prompts = [torch.randint(0, vocab, (n,), generator=gen) for n in call.values()]
        out = engine.prefill(list(call), prompts)
        assert out.shape == (len(call), vocab) and out.dtype == torch.float32
        for i, rid in enumerate(call):
            history[rid] = prompts[i].tolist()
            want = ref.forward(torch.tensor(history[rid])[None])[0, -1]
            worst = max(worst, (out[i] - want).abs().max().item())
        # every live request still decodes correctly: padding tokens touched no live slot
        ids = sorted(history)
        tokens = torch.randint(0, vocab, (len(ids),), generator=gen)
        out = engine.decode(ids, tokens)
        for i, rid in enumerate(ids):
            history[rid].append(int(tokens[i]))
            want = ref.forward(torch.tensor(history[rid])[None])[0, -1]
            worst = max(worst, (out[i] - want).abs().max().item())
    assert worst < 1e-4, worst
    # all buckets at set-up; later only the buckets in use again after a pool growth
    assert graphs.captured[:5] == [256, 128, 64, 32, 16]
    assert len(graphs.captured) == 5 or engine.cache.generation > 0


def test_hopper_buckets_build_schedules_for_their_own_tiles(
    tiny_config, sharp_weights, monkeypatch
):
    """The Hopper tile rule with its short-call threshold at 64 tokens: buckets 16-64 build
    16-row q-block schedules and 128 a 64-row one, side by side in one metadata buffer; a call
    in each bucket matches the reference."""
    import variants.execution.prefill_graphs as graphs_module
    import variants.kernels.prefill_attention as attention_module

    for module in (graphs_module, attention_module):
        monkeypatch.setattr(module, "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(attention_module, "SHORT_TOKENS", 64)
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    engine = assemble_engine(
        tiny_config, sharp_weights, "cpu", cache_cls=PagedKVCache, attention_cls=TritonAttention,
        stack=run_triton_stack,
    )  # fmt: skip
    graphs = _emulated(engine, largest_tokens=128, most_prompts=3)
    assert graphs.block_m == {16: 16, 32: 16, 64: 16, 128: 64}
    gen = torch.Generator().manual_seed(3)
    for call in ({7: 5, 3: 34}, {21: 100, 22: 28}):  # buckets 64 and 128
        prompts = [torch.randint(0, tiny_config["vocab_size"], (n,), generator=gen)
                   for n in call.values()]  # fmt: skip
        out = engine.prefill(list(call), prompts)
        for i, prompt in enumerate(prompts):
            want = ref.forward(prompt[None])[0, -1]
            assert (out[i] - want).abs().max().item() < 1e-4


def test_a_table_s_buckets_build_schedules_for_its_tiles_and_launch_them(
    tiny_config, sharp_weights, prefill_launches
):
    """The attention's prefill table (tokens -> tiles): its buckets build their q-block
    schedules for the table's BLOCK_M and launch its tiles, the others the rules' (64 x 64 on
    the CPU); a call in each bucket matches the reference."""
    import functools

    table = {32: {"tiles": (16, 16, 2, 2)}, 64: {"tiles": (32, 16, 4, 3)}}
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    engine = assemble_engine(
        tiny_config, sharp_weights, "cpu", cache_cls=SlabKVCache,
        attention_cls=functools.partial(TritonAttention, prefill_knobs=table),
        stack=run_triton_stack,
    )  # fmt: skip
    graphs = _emulated(engine, largest_tokens=128, most_prompts=3)
    assert graphs.block_m == {16: 64, 32: 16, 64: 32, 128: 64}
    gen = torch.Generator().manual_seed(6)
    for call in ({1: 20, 2: 9}, {3: 37, 4: 20}, {5: 70, 6: 30}):  # buckets 32, 64 and 128
        prompts = [torch.randint(0, tiny_config["vocab_size"], (n,), generator=gen)
                   for n in call.values()]  # fmt: skip
        prefill_launches.clear()
        out = engine.prefill(list(call), prompts)
        bucket = next(t for t in graphs.buckets if t >= sum(call.values()))
        assert prefill_launches == [(bucket, table.get(bucket, {}).get("tiles"))] * 2  # two layers
        for i, prompt in enumerate(prompts):
            want = ref.forward(prompt[None])[0, -1]
            assert (out[i] - want).abs().max().item() < 1e-4


def _checked_engine(config, weights, check_ids, largest_tokens=64):
    """A slab engine with emulated prefill graphs and the deferred check of ids on a GPU, run by
    the graph (`check_ids`) or by the engine before the step."""
    engine = assemble_engine(
        config, weights, "cpu", cache_cls=SlabKVCache, attention_cls=TritonAttention,
        stack=run_torch_stack,
    )  # fmt: skip
    graphs = _emulated(engine, largest_tokens=largest_tokens, most_prompts=4, check_ids=check_ids)
    engine.check_device_tokens = False
    assert engine.prefill_runner.check_ids is check_ids
    return engine, graphs


@pytest.mark.parametrize("check_ids", [False, True], ids=["engine-check", "graph-check"])
def test_a_bad_id_in_place_raises_and_the_next_call_is_clean(check_ids, tiny_config, sharp_weights):
    """Ids are concatenated straight into the graph's token buffer and clamped inside the graph.
    A bad id (checked after the launch, as for ids on a GPU) raises by name and frees the new
    requests; the next, shorter call in the same bucket, with the bad id left in its padding,
    matches the reference, and so does the request that was live before."""
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    engine, graphs = _checked_engine(tiny_config, sharp_weights, check_ids)
    vocab = tiny_config["vocab_size"]
    live = torch.tensor([3, 1, 4, 1, 5])
    engine.prefill([1], [live])
    bad = torch.tensor([7] * 20 + [vocab + 5] + [2] * 9)
    with pytest.raises(ValueError, match=f"token id {vocab + 5} is outside the vocabulary"):
        engine.prefill([2, 3], [bad, torch.tensor([6, 6])])
    assert set(engine.lengths) == {1}
    assert graphs.tokens[20].item() == vocab - 1  # clamped in the buffer by the graph
    prompt = torch.tensor([9, 8, 7])
    out = engine.prefill([4], [prompt])
    assert torch.allclose(out[0], ref.forward(prompt[None])[0, -1], atol=1e-4)
    step = engine.decode([1], torch.tensor([2]))
    want = ref.forward(torch.cat([live, torch.tensor([2])])[None])[0, -1]
    assert torch.allclose(step[0], want, atol=1e-4)


@pytest.mark.parametrize("check_ids", [False, True], ids=["engine-check", "graph-check"])
def test_no_unchecked_id_stays_in_the_buffer(check_ids, tiny_config, tiny_weights, monkeypatch):
    """The buffer's padding rows are checked by later graphs: a call that fails before its
    graph runs leaves no bad id there, and a re-prefill (checked before any state changes)
    never writes into it."""
    engine, graphs = _checked_engine(tiny_config, tiny_weights, check_ids)
    vocab = tiny_config["vocab_size"]
    engine.prefill([1], [torch.tensor([3, 1, 4])])
    with pytest.raises(ValueError, match=f"token id {vocab + 2} is outside"):
        engine.prefill([1], [torch.tensor([vocab + 2, 5])])  # a re-prefill: checked first
    assert engine.lengths == {1: 3}

    def no_room(rid, n):
        raise RuntimeError("no room")

    monkeypatch.setattr(engine.cache, "allocate", no_room)
    with pytest.raises(RuntimeError, match="no room"):
        engine.prefill([2], [torch.tensor([vocab + 9, 5, 6])])
    assert 0 <= graphs.tokens.min().item() and graphs.tokens.max().item() < vocab
    monkeypatch.undo()
    out = engine.prefill([3], [torch.tensor([2, 7])])  # the bucket's padding held both ids
    assert out.shape == (1, vocab)


@pytest.mark.parametrize("check_ids", [False, True], ids=["engine-check", "graph-check"])
def test_after_a_move_a_bucket_runs_eagerly_then_its_capture_keeps_the_ids(
    check_ids, tiny_config, tiny_weights
):
    """After the pool moved, a bucket's first call runs eagerly (its ids checked there), its
    second captures it. A capture runs the body, which clamps the token buffer: the call's own
    unchecked ids, concatenated into it, are put back before the replay checks them."""
    engine, graphs = _checked_engine(tiny_config, tiny_weights, check_ids=check_ids)
    vocab = tiny_config["vocab_size"]
    graphs.captured.clear()
    engine.cache.generation += 1  # what a pool growth does
    with pytest.raises(ValueError, match=f"token id {vocab + 1} is outside"):
        engine.prefill([4], [torch.tensor([vocab + 1, 3])])
    assert graphs.captured == [] and engine.lengths == {}
    with pytest.raises(ValueError, match=f"token id {vocab} is outside"):
        engine.prefill([5], [torch.tensor([1, vocab, 2])])
    assert graphs.captured == [16] and engine.lengths == {}


def _gathering_engine(config, weights, largest_tokens=64, most_prompts=3):
    """A slab engine on the Triton stack with its gathered embedding: the emulated graphs read
    the prompts in place (kernels/prompt_gather.py), as on a GPU whose ids are checked late."""
    from variants.kernels.prompt_gather import gathered_embedding

    engine = assemble_engine(
        config, weights, "cpu", cache_cls=SlabKVCache, attention_cls=TritonAttention,
        stack=run_triton_stack,
    )  # fmt: skip
    graphs = _emulated(
        engine, largest_tokens=largest_tokens, most_prompts=most_prompts,
        gathered_embedding=gathered_embedding,
    )  # fmt: skip
    engine.check_device_tokens = False
    assert graphs.gather
    return engine, graphs


def test_gathering_graphs_read_the_prompts_where_they_are(tiny_config, sharp_weights):
    """Prompts apart, one a strided view; a re-prefill of two prompts (checked first, then
    gathered from their concatenation); a call of more prompts than the table (eager). Every
    call and the decode after it match the reference, and no call wrote the token buffer."""
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    engine, graphs = _gathering_engine(tiny_config, sharp_weights)
    gen = torch.Generator().manual_seed(4)
    vocab = tiny_config["vocab_size"]
    strided = torch.randint(0, vocab, (40,), generator=gen)[::2]
    calls = [
        {1: torch.randint(0, vocab, (9,), generator=gen), 2: strided},
        {1: torch.randint(0, vocab, (30,), generator=gen), 2: torch.tensor([3, 4])},
        {3: torch.tensor([5]), 4: torch.tensor([6, 7]), 5: torch.tensor([8]), 6: torch.tensor([9])},
    ]
    history: dict = {}
    built_at = graphs.values.buffer_info()[0]
    for call in calls:
        out = engine.prefill(list(call), list(call.values()))
        # each call's ints went into place: the array neither grew nor moved
        assert graphs.values.buffer_info() == (built_at, graphs.values_size)
        for i, (rid, prompt) in enumerate(call.items()):
            history[rid] = prompt.tolist()
            want = ref.forward(prompt[None])[0, -1]
            assert (out[i] - want).abs().max().item() < 1e-4
    ids = sorted(history)
    tokens = torch.randint(0, vocab, (len(ids),), generator=gen)
    out = engine.decode(ids, tokens)
    for i, rid in enumerate(ids):
        want = ref.forward(torch.tensor(history[rid] + [int(tokens[i])])[None])[0, -1]
        assert (out[i] - want).abs().max().item() < 1e-4
    assert not graphs.tokens.any()


def test_a_bad_gathered_id_raises_and_the_next_call_is_clean(tiny_config, sharp_weights):
    """A bad id in the second prompt raises by name after the graph and frees the call's
    requests; the next call in the same bucket and the request live before are intact; so is
    a call whose bucket is captured again first (its capture fills the host buffer too)."""
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    engine, graphs = _gathering_engine(tiny_config, sharp_weights)
    vocab = tiny_config["vocab_size"]
    live = torch.tensor([3, 1, 4, 1, 5])
    engine.prefill([1], [live])
    bad = torch.tensor([7] * 20 + [vocab + 5] + [2] * 9)
    with pytest.raises(ValueError, match=f"token id {vocab + 5} is outside the vocabulary"):
        engine.prefill([2, 3], [torch.tensor([6, 6]), bad])
    assert set(engine.lengths) == {1}
    graphs.captured.clear()
    engine.cache.generation += 1  # what a pool growth does: the bucket's next call runs eagerly
    with pytest.raises(ValueError, match="token id -1 is outside the vocabulary"):
        engine.prefill([4], [torch.tensor([2, -1])])
    assert graphs.captured == [] and set(engine.lengths) == {1}
    with pytest.raises(ValueError, match="token id -2 is outside the vocabulary"):
        engine.prefill([4], [torch.tensor([2, 5, -2])])  # the same bucket: captured now
    assert graphs.captured == [16] and set(engine.lengths) == {1}
    prompt = torch.tensor([9, 8, 7] * 8)
    out = engine.prefill([5], [prompt])
    assert torch.allclose(out[0], ref.forward(prompt[None])[0, -1], atol=1e-4)
    step = engine.decode([1, 5], torch.tensor([2, 3]))
    want = ref.forward(torch.cat([live, torch.tensor([2])])[None])[0, -1]
    assert torch.allclose(step[0], want, atol=1e-4)


def test_returned_logits_are_a_copy(tiny_config, tiny_weights):
    engine = assemble_engine(
        tiny_config, tiny_weights, "cpu", cache_cls=SlabKVCache, attention_cls=TritonAttention,
        stack=run_torch_stack,
    )  # fmt: skip
    graphs = _emulated(engine, largest_tokens=64, most_prompts=2)
    first = engine.prefill([1], [torch.tensor([1, 2, 3])])
    kept = first.clone()
    engine.prefill([2], [torch.tensor([4, 5, 6, 7])])
    assert torch.equal(first, kept)
    statics = [graphs.hidden] + [views[-1] for views in graphs.head_outputs.values()]
    for static in statics:
        assert first.untyped_storage().data_ptr() != static.untyped_storage().data_ptr()


def test_a_grown_pool_recaptures_only_the_bucket_asked_for_again(tiny_config, sharp_weights):
    """After the pool moved: a bucket's first call runs eagerly, its second captures it, and no
    other bucket is captured; every call matches the reference."""
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    engine = assemble_engine(
        tiny_config, sharp_weights, "cpu", cache_cls=PagedKVCache, attention_cls=TritonAttention,
        stack=run_torch_stack,
    )  # fmt: skip
    graphs = _emulated(engine, largest_tokens=64, most_prompts=4)
    graphs.captured.clear()
    engine.cache.generation += 1  # what a pool growth does
    prompts = [torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6, 7, 8]), torch.tensor([9] * 20)]
    captured = [[], [16], [16]]  # (20 tokens: the 32-token bucket's first call)
    for rid, (prompt, want) in enumerate(zip(prompts, captured)):
        out = engine.prefill([rid], [prompt])
        assert graphs.captured == want and set(graphs.graphs) == set(want)
        assert torch.allclose(out[0], ref.forward(prompt[None])[0, -1], atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cache", ["slab", "paged"])
def test_gpu_captured_prefill_matches_eager_and_reference(cache, tmp_path):
    import json
    from pathlib import Path

    from evaluator.toy_weights import save_toy_weights

    config = json.loads((Path(__file__).parents[3] / "target/model_config.json").read_text())
    save_toy_weights(config, tmp_path / "model.pt")
    base = dict(cache=cache, block_size=64, attention="triton", layers="triton", graphs="pow2")
    graphed = build_engine(config, str(tmp_path), "cuda", Variant(**base, prefill_graphs="pow2"))
    eager = build_engine(config, str(tmp_path), "cuda", Variant(**base))
    ref = ReferenceModel(config, str(tmp_path), "cuda")
    gen = torch.Generator().manual_seed(0)
    for lengths in ([128] * 4, [1, 7, 13, 64, 128, 300], [2048, 2048, 2048, 2048], [4000]):
        ids = list(range(len(lengths)))
        prompts = [torch.randint(0, config["vocab_size"], (n,), generator=gen).cuda()
                   for n in lengths]  # fmt: skip
        got = graphed.prefill(ids, prompts)
        want = eager.prefill(ids, prompts)
        assert (got - want).abs().max().item() < 1e-2
        for i, p in enumerate(prompts):
            expected = ref.forward(p[None])[0, -1].float()
            torch.testing.assert_close(got[i], expected, atol=1e-2, rtol=1e-2)


def test_a_dropped_runners_layer_and_head_graphs_wait_for_the_next_runner(
    tiny_config, tiny_weights, library_engine
):
    """As the decode runner's (test_cuda_graphs.py): the head graphs too."""
    from variants.execution.cuda_graphs import RETIRED_GRAPHS

    class Graph:  # stands in for a captured graph
        pass

    engine = library_engine(
        tiny_config, tiny_weights, "cpu", Variant(cache="slab", attention="triton")
    )
    gc.disable()
    try:
        runner = PrefillGraphs(engine, largest_tokens=32, most_prompts=2)
        runner.graphs[32], runner.heads[1] = Graph(), Graph()
        graphs = [weakref.ref(runner.graphs[32]), weakref.ref(runner.heads[1])]
        del runner
        assert all(g() is not None for g in graphs) and len(RETIRED_GRAPHS) == 2
        PrefillGraphs(engine, largest_tokens=32, most_prompts=2)
        assert all(g() is None for g in graphs)
    finally:
        gc.enable()
