"""CUDA-graph decode: bucket policies, and the captured body's padding/scratch logic run on the
CPU (each "graph" replays the body eagerly on the static buffers). Real capture: gpu tests."""

import gc
import weakref

import pytest
import torch

import variants.engine
from evaluator.reference_model import ReferenceModel
from variants import Variant, build_engine
from variants.execution.cuda_graphs import batch_buckets, doubling_buckets


def test_batch_bucket_policies():
    assert batch_buckets("pow2", 64) == [1, 2, 4, 8, 16, 32, 64]
    assert batch_buckets("pow2", 48) == [1, 2, 4, 8, 16, 32, 48]
    assert batch_buckets("every8", 32) == [1, 2, 4, 8, 16, 24, 32]
    with pytest.raises(ValueError, match="policy"):
        batch_buckets("fibonacci", 8)


def test_buckets_double_up_to_the_largest():
    """The decode graphs' contexts from 128, the prefill graphs' tokens from 16."""
    assert doubling_buckets(128, 4096) == [128, 256, 512, 1024, 2048, 4096]
    assert doubling_buckets(128, 300) == [128, 256, 300]
    assert doubling_buckets(128, 100) == [100]
    assert doubling_buckets(16, 8192) == [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
    assert doubling_buckets(16, 100) == [16, 32, 64, 100]


@pytest.mark.parametrize("cache", ["slab", "paged"])
def test_padded_buckets_match_reference_and_touch_no_live_state(
    cache, tiny_config, sharp_weights, emulate_decode_graphs, library_engine
):
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    engine = library_engine(tiny_config, sharp_weights, "cpu", Variant(cache=cache, block_size=16))
    emulate_decode_graphs(engine, largest=4)
    gen = torch.Generator().manual_seed(3)
    history = {}
    for rid, n in [(70, 5), (3, 130), (11, 1), (900, 17), (5, 2)]:
        prompt = torch.randint(0, tiny_config["vocab_size"], (n,), generator=gen)
        engine.prefill([rid], [prompt])
        history[rid] = prompt.tolist()
    # batches of 3 pad to 4 (a scratch row), batch 5 is beyond the largest bucket (eager)
    schedule = [[3, 11, 70], [11], [900, 3, 70, 11, 5], [5, 900], [3, 11, 70]]
    worst = 0.0
    for ids in schedule:
        tokens = torch.randint(0, tiny_config["vocab_size"], (len(ids),), generator=gen)
        out = engine.decode(ids, tokens)
        assert out.shape == (len(ids), tiny_config["vocab_size"]) and out.dtype == torch.float32
        for i, rid in enumerate(ids):
            history[rid].append(int(tokens[i]))
            expected = ref.forward(torch.tensor(history[rid])[None])[0, -1].float()
            worst = max(worst, (out[i] - expected).abs().max().item())
    assert worst < 1e-4


def test_returned_logits_are_a_copy_of_the_static_buffer(
    tiny_config, tiny_weights, emulate_decode_graphs, library_engine
):
    engine = library_engine(tiny_config, tiny_weights, "cpu", Variant(cache="slab"))
    graphs = emulate_decode_graphs(engine, largest=2)
    engine.prefill([1, 2], [torch.tensor([1, 2, 3]), torch.tensor([4, 5])])
    first = engine.decode([1], torch.tensor([7]))
    kept = first.clone()
    engine.decode([2], torch.tensor([9]))
    assert torch.equal(first, kept)
    for views in graphs.outputs.values():  # the logits each graph writes
        assert first.untyped_storage().data_ptr() != views[-1].untyped_storage().data_ptr()


def test_cache_growth_recaptures_the_buckets_calls_need(
    tiny_config, tiny_weights, emulate_decode_graphs, library_engine
):
    engine = library_engine(tiny_config, tiny_weights, "cpu", Variant(cache="slab"))
    graphs = emulate_decode_graphs(engine, largest=2)
    graphs.captured.clear()
    slots = engine.cache.slots
    ids = list(range(slots + 1))  # one more request than slots: the slab grows
    engine.prefill(ids, [torch.tensor([1, 2])] * len(ids))
    assert engine.cache.generation == 1
    engine.decode([0], torch.tensor([3]))
    engine.decode([1, 2], torch.tensor([3, 4]))
    engine.decode([3], torch.tensor([5]))
    assert graphs.captured == [(1, 128), (2, 128)] and graphs.generation == 1


@pytest.mark.parametrize("check_ids", [False, True], ids=["engine-check", "graph-check"])
def test_a_bad_id_raises_by_name_and_leaves_the_requests_as_they_were(
    check_ids, tiny_config, sharp_weights, monkeypatch, emulate_decode_graphs, library_engine
):
    """Ids on a GPU are checked after the step is queued: by the engine before the replay, or
    inside the graph (and before the eager step beyond the largest bucket). A bad id raises by
    name in a padded bucket and in the eager step, the lengths are restored, the graph's
    buffer holds it clamped, and the next steps, the bad id left in a padding row, match the
    reference."""
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    engine = library_engine(
        tiny_config, sharp_weights, "cpu", Variant(cache="paged", block_size=16)
    )
    graphs = emulate_decode_graphs(engine, largest=4, check_ids=check_ids)
    engine.check_device_tokens = False  # the deferred check of ids on a GPU:
    monkeypatch.setattr(variants.engine, "token_ids_on_host", lambda ids: False)
    assert engine.decode_runner.check_ids is check_ids
    vocab = tiny_config["vocab_size"]
    history = {rid: [rid, 2, 3] for rid in range(5)}
    engine.prefill(list(history), [torch.tensor(h) for h in history.values()])
    for ids, bad in (([0, 1, 2], vocab + 3), ([0, 1, 2, 3, 4], -4)):  # a bucket of 4; eager
        tokens = torch.tensor([5] * (len(ids) - 1) + [bad])
        with pytest.raises(ValueError, match=f"decode: token id {bad} is outside"):
            engine.decode(ids, tokens)
        assert engine.lengths == {rid: 3 for rid in history}
    assert graphs.tokens[2].item() == vocab - 1  # clamped by the graph
    for ids in ([0, 1], [4, 3, 2, 1, 0], [2]):
        tokens = torch.tensor([7 + i for i in range(len(ids))])
        out = engine.decode(ids, tokens)
        for i, rid in enumerate(ids):
            history[rid].append(int(tokens[i]))
            want = ref.forward(torch.tensor(history[rid])[None])[0, -1].float()
            assert (out[i] - want).abs().max().item() < 1e-4


def test_triton_attention_graphs_fix_their_splits_per_context_bucket(
    tiny_config, sharp_weights, monkeypatch, emulate_decode_graphs, library_engine
):
    """On Hopper the Triton attention asks for two context buckets (LONG_CONTEXT lowered to 64
    here, the capability and SM count the H200's): steps up to 64 tokens of context replay the
    first graph, with one split a row (at most one per 64 tokens of a short bucket); past 64,
    the second, with 16 (few rows, long bucket: `choose_num_splits`). Every step matches the
    reference."""
    pytest.importorskip("triton")
    import variants.attention.triton_attention as triton_attention
    import variants.kernels.decode_attention_rules as rules

    monkeypatch.setattr(rules, "LONG_CONTEXT", 64)
    monkeypatch.setattr(triton_attention, "device_sm_count", lambda device: 132)
    monkeypatch.setattr(triton_attention, "device_capability", lambda device: (9, 0))
    splits, launch = [], triton_attention.paged_decode_attention
    monkeypatch.setattr(
        triton_attention, "paged_decode_attention",
        lambda *args, **kwargs: splits.append(kwargs["num_splits"]) or launch(*args, **kwargs),
    )  # fmt: skip
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    variant = Variant(cache="slab", attention="triton")
    engine = library_engine(tiny_config, sharp_weights, "cpu", variant)
    graphs = emulate_decode_graphs(engine, largest=2)
    assert graphs.contexts == [64, tiny_config["max_position_embeddings"]]
    history = list(range(1, 63))
    engine.prefill([0], [torch.tensor(history)])
    for token, want_splits in ((5, 1), (6, 1), (7, 16), (8, 16)):  # contexts 63-66
        splits.clear()
        out = engine.decode([0], torch.tensor([token]))
        history.append(token)
        assert splits == [want_splits] * tiny_config["num_hidden_layers"]
        want = ref.forward(torch.tensor(history)[None])[0, -1].float()
        assert (out[0] - want).abs().max().item() < 1e-4


def test_a_knob_table_sets_the_graphs_contexts_and_each_buckets_launch(
    tiny_config, sharp_weights, monkeypatch, emulate_decode_graphs, library_engine
):
    """The kernel search's table (tuning/decode_attention.py): its contexts are the graphs'
    buckets and a bucket's graph launches the decode attention with its row of the table, on
    any GPU; every step matches the reference."""
    pytest.importorskip("triton")
    import variants.attention.triton_attention as triton_attention

    launches, launch = [], triton_attention.paged_decode_attention
    monkeypatch.setattr(
        triton_attention, "paged_decode_attention",
        lambda *args, **kwargs: launches.append(kwargs) or launch(*args, **kwargs),
    )  # fmt: skip
    short = {"num_splits": 2, "tiles": (16, 4, 2), "split_tokens": 16, "max_registers": 0}
    long = {"num_splits": 3, "tiles": (32, 4, 2), "split_tokens": 32, "min_programs": 0}
    most = tiny_config["max_position_embeddings"]
    knobs = {(b, c): dict(row) for b in (1, 2) for c, row in ((64, short), (most, long))}
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    variant = Variant(cache="slab", attention="triton")
    engine = library_engine(tiny_config, sharp_weights, "cpu", variant, knobs=knobs)
    graphs = emulate_decode_graphs(engine, largest=2)
    assert graphs.contexts == [64, most]
    history = list(range(1, 63))
    engine.prefill([0], [torch.tensor(history)])
    for token, want in ((5, short), (6, short), (7, long)):  # contexts 63-65
        launches.clear()
        out = engine.decode([0], torch.tensor([token]))
        history.append(token)
        got = [{k: kw[k] for k in want} for kw in launches]
        assert got == [want] * tiny_config["num_hidden_layers"]
        expect = ref.forward(torch.tensor(history)[None])[0, -1].float()
        assert (out[0] - expect).abs().max().item() < 1e-4


def test_triton_attention_graphs_before_hopper_keep_one_context_bucket(
    tiny_config, tiny_weights, emulate_decode_graphs, library_engine
):
    pytest.importorskip("triton")
    engine = library_engine(
        tiny_config, tiny_weights, "cpu", Variant(cache="slab", attention="triton")
    )
    graphs = emulate_decode_graphs(engine, largest=2)
    assert graphs.contexts == [tiny_config["max_position_embeddings"]]


def _gathering_engine(config, weights, cache: str, emulate, largest: int = 4, attention="triton"):
    """The fused layers on `attention` with the gathered embedding: the emulated graphs read the
    call's ids in place and their metadata from the host buffer (prompt_gather.py), and every
    kernel that reads the metadata (the first layer's positions, a slab's rows for an attention
    that views the pool) runs after the inputs kernel wrote it."""
    pytest.importorskip("triton")
    from variants.attention.manual import ManualAttention
    from variants.attention.sdpa import SdpaAttention
    from variants.attention.triton_attention import TritonAttention
    from variants.cache.paged import PagedKVCache
    from variants.cache.slab import SlabKVCache
    from variants.engine import assemble_engine
    from variants.kernels.prompt_gather import gathered_embedding
    from variants.layers.fused_stack import fused_head, run_fused_stack

    cache_cls = SlabKVCache if cache == "slab" else PagedKVCache
    engine = assemble_engine(
        config, weights, "cpu", cache_cls=cache_cls, stack=run_fused_stack, head=fused_head,
        attention_cls={"triton": TritonAttention, "manual": ManualAttention,
                       "sdpa": SdpaAttention}[attention],
    )  # fmt: skip
    graphs = emulate(engine, largest=largest, gathered_embedding=gathered_embedding)
    engine.check_device_tokens = False  # the ids checked late, as on a GPU
    assert graphs.gather and graphs.check_ids
    return engine, graphs


@pytest.mark.parametrize(
    "cache,attention",
    [("slab", "triton"), ("paged", "triton"), ("slab", "manual"), ("slab", "sdpa")],
)
def test_gathering_graphs_read_the_ids_where_they_are(
    cache, attention, tiny_config, sharp_weights, emulate_decode_graphs
):
    """Ids as a tensor, a slice at an offset, a strided view, int32 and a list; batches that pad
    to a bucket and one past the largest (eager); the rows change from call to call (an
    attention that views a slab reads this call's rows, not the last call's). Every row matches
    the reference, and no call wrote the token buffer."""
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    engine, graphs = _gathering_engine(
        tiny_config, sharp_weights, cache, emulate_decode_graphs, attention=attention
    )
    gen = torch.Generator().manual_seed(6)
    vocab = tiny_config["vocab_size"]
    history = {}
    for rid, n in [(4, 9), (8, 1), (15, 40), (16, 3), (23, 2)]:
        prompt = torch.randint(0, vocab, (n,), generator=gen)
        engine.prefill([rid], [prompt])
        history[rid] = prompt.tolist()
    pool = torch.randint(1, vocab, (64,), generator=gen)
    steps = [
        ([4, 8, 15], pool[:3]),
        ([15], pool[10:11]),  # an offset into the pool
        ([23, 16, 8, 4], pool[20:28:2]),  # a strided view
        ([8, 4], pool[30:32].int()),
        ([16, 23, 4], pool[40:43].tolist()),
        ([4, 8, 15, 16, 23], pool[50:55]),  # past the largest bucket: eager
        ([15, 8], pool[60:62]),
    ]
    for ids, tokens in steps:
        out = engine.decode(ids, tokens)
        assert out.shape == (len(ids), vocab) and out.dtype == torch.float32
        for i, rid in enumerate(ids):
            history[rid].append(int(torch.as_tensor(tokens)[i]))
            want = ref.forward(torch.tensor(history[rid])[None])[0, -1].float()
            assert (out[i] - want).abs().max().item() < 1e-4, (ids, rid)
    assert not graphs.tokens.any()


def test_a_bad_gathered_id_raises_and_leaves_the_requests_as_they_were(
    tiny_config, sharp_weights, monkeypatch, emulate_decode_graphs
):
    """A bad id read in place raises by name after the step, the lengths are restored, and the
    next steps in the same bucket match the reference."""
    monkeypatch.setattr(variants.engine, "token_ids_on_host", lambda ids: False)
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    engine, graphs = _gathering_engine(tiny_config, sharp_weights, "paged", emulate_decode_graphs)
    vocab = tiny_config["vocab_size"]
    history = {rid: [rid + 1, 2, 3] for rid in range(3)}
    engine.prefill(list(history), [torch.tensor(h) for h in history.values()])
    for bad in (vocab, -1):
        with pytest.raises(ValueError, match=f"decode: token id {bad} is outside"):
            engine.decode([0, 1, 2], torch.tensor([5, bad, 6]))
        assert engine.lengths == {rid: 3 for rid in history}
    for ids in ([2, 0, 1], [1]):
        tokens = torch.tensor([9 + i for i in range(len(ids))])
        out = engine.decode(ids, tokens)
        for i, rid in enumerate(ids):
            history[rid].append(int(tokens[i]))
            want = ref.forward(torch.tensor(history[rid])[None])[0, -1].float()
            assert (out[i] - want).abs().max().item() < 1e-4
    assert not graphs.tokens.any()


@pytest.mark.parametrize("attention,recaptured", [("triton", []), ("sdpa", [(1, 1024)])])
def test_a_slab_laid_out_anew_in_place_keeps_the_graphs_that_read_its_table(
    attention,
    recaptured,
    tiny_config,
    sharp_weights,
    emulate_decode_graphs,
    monkeypatch,
    steps_match_reference,
    library_engine,
):
    """A prompt longer than the slab's slots, under a limit the pool's memory already meets:
    the slots grow longer in place. Graphs that read the cache through its block table (Triton)
    keep working without a capture: every launch finds a row from its table entry, the slot's
    first token, with one block size whatever the slots' length (a graph holds the launch's
    numbers); graphs of views of it (SDPA) capture again. Both match the reference."""
    import variants.attention.triton_attention as triton_attention
    from variants.cache.pool import pool_bytes

    launched = triton_attention.paged_decode_attention
    block_sizes = []

    def recording(*args, **kwargs):
        block_sizes.append((args[5], kwargs["offsets"]))
        return launched(*args, **kwargs)

    monkeypatch.setattr(triton_attention, "paged_decode_attention", recording)

    config = {**tiny_config, "max_position_embeddings": 2048}
    variant = Variant(cache="slab", attention=attention, cache_tokens=4 * 512)
    engine = library_engine(config, sharp_weights, "cpu", variant)
    graphs = emulate_decode_graphs(engine, largest=2)
    cache = engine.cache
    cache.limit_bytes = pool_bytes(engine.spec, cache.dtype, cache.k.shape[1])
    graphs.captured.clear()
    prompt = torch.randint(
        0, config["vocab_size"], (700,), generator=torch.Generator().manual_seed(5)
    )
    engine.prefill([1], [prompt])
    assert (cache.max_len, cache.generation, cache.layout) == (1024, 0, 1)
    steps_match_reference(engine, config, prompt)
    assert graphs.captured == recaptured
    assert set(block_sizes) <= {(config["max_position_embeddings"], True)}
    assert len(block_sizes) >= (0 if attention == "sdpa" else 2 * config["num_hidden_layers"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_a_slab_laid_out_in_place_keeps_its_captured_graphs(tmp_path):
    """The fastest preset on the course model, its slab under a limit its first pool meets (as
    the course's 8 GiB budget does): prompts longer than its 2048-token slots lay it out anew in
    place, and the captured prefill and decode graphs run on, none captured again, matching an
    eager engine and the reference."""
    import dataclasses
    import json
    from pathlib import Path

    from evaluator.toy_weights import save_toy_weights
    from variants.cache.pool import pool_bytes
    from variants.presets import PRESETS

    config = json.loads((Path(__file__).parents[3] / "target/model_config.json").read_text())
    save_toy_weights(config, tmp_path / "model.pt")
    variant = dataclasses.replace(PRESETS["slab-triton-pdl-allgraphs"], cache_tokens=131072)
    graphed = build_engine(config, str(tmp_path), "cuda", variant)
    eager = build_engine(config, str(tmp_path), "cuda", Variant(cache="slab", attention="triton"))
    ref = ReferenceModel(config, str(tmp_path), "cuda")
    cache = graphed.cache
    cache.limit_bytes = pool_bytes(graphed.spec, cache.dtype, cache.k.shape[1])
    captured = dict(graphed.decode_runner.graphs), dict(graphed.prefill_runner.graphs)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, config["vocab_size"], (2100,), generator=gen).cuda()] * 2
    got, want = graphed.prefill([1, 2], prompts), eager.prefill([1, 2], prompts)
    assert (cache.max_len, cache.generation, cache.layout) == (4096, 0, 1)
    torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)
    history = [p.tolist() for p in prompts]
    for step in range(3):
        tokens = torch.tensor([step + 1, step + 2], device="cuda")
        got, want = graphed.decode([1, 2], tokens), eager.decode([1, 2], tokens)
        torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)
        for i in range(2):
            history[i].append(int(tokens[i]))
        expected = ref.forward(torch.tensor(history[0], device="cuda")[None])[0, -1].float()
        torch.testing.assert_close(got[0], expected, atol=1e-2, rtol=1e-2)
    runners = graphed.decode_runner.graphs, graphed.prefill_runner.graphs
    for before, now in zip(captured, runners):
        assert all(now.get(key) is graph for key, graph in before.items())


class Graph:
    """Stands in for a captured graph (alive while referenced)."""


def test_a_dropped_engines_graphs_are_destroyed_when_the_next_engine_is_made(
    tiny_config, tiny_weights, library_engine
):
    """The grader's `engine = create_engine(...)` drops the last engine just before the new
    one's first timed call: its graphs outlive it until the next runner is made (with the
    collector off, as the grader runs)."""
    from variants.execution.cuda_graphs import RETIRED_GRAPHS, DecodeGraphs

    engine = library_engine(tiny_config, tiny_weights, "cpu", Variant(cache="slab"))
    gc.disable()
    try:
        runner = DecodeGraphs(engine, "pow2", largest_batch=2)
        runner.graphs[1, 128] = first = Graph()
        first, runner.graphs[1, 128] = weakref.ref(first), Graph()  # (a pool move)
        assert first() is None  # a pool move drops graphs at once
        kept = weakref.ref(runner.graphs[1, 128])
        runner = DecodeGraphs(engine, "pow2", largest_batch=2)  # the assignment drops the last
        assert kept() is not None and len(RETIRED_GRAPHS) == 1
        DecodeGraphs(engine, "pow2", largest_batch=2)  # the next one made
        assert kept() is None and RETIRED_GRAPHS == []
    finally:
        gc.enable()
