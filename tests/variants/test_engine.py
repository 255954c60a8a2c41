"""The engine against the reference model, for every CPU cache x attention x fusion assembly, and
the course interface's contract: fresh float32 [B, vocab] logits, only last tokens through the
head, and bad calls that raise by name and leave every request as it was."""

import dataclasses

import pytest
import torch

import variants.engine
from evaluator.reference_model import ReferenceModel
from variants import Variant, build_engine

A, B, C, D = 10**9 + 7, 3, 10**12 + 1, 42  # large and unsorted on purpose
# (op, ids, prompt lengths): a re-prefill of a live id (A, shorter), ragged decodes in shuffled
# orders, a removal and a removed id coming back (B), prompts across 16- and 64-token blocks.
SCRIPT = (
    ("prefill", [A, B, C], [13, 1, 70]),
    ("decode", [C, A], None),
    ("decode", [B, A, C], None),
    ("prefill", [A, D], [5, 17]),
    ("decode", [D, B, A, C], None),
    ("remove", [B], None),
    ("decode", [A, C, D], None),
    ("prefill", [B], [3]),
    ("decode", [C, B, D], None),
    ("decode", [B], None),
)
ENGINE_VARIANTS = [
    Variant(cache=cache, block_size=block, attention=attention, fuse_qkv=fuse, fuse_gate_up=fuse)
    for cache, block in (("contiguous", 16), ("slab", 16), ("paged", 16), ("paged", 64))
    for attention in ("manual", "sdpa")
    for fuse in (True, False)
]
# float32 on CPU: batched vs per-request arithmetic differs by rounding only (measured max
# |d| 5.3e-6 on the sharp weights, every variant); a RoPE, mask or order bug moves them by > 0.1.
TOL = 5e-4


def materialize_script(vocab: int) -> list:
    gen = torch.Generator().manual_seed(11)
    calls = []
    for op, ids, lengths in SCRIPT:
        if op == "prefill":
            calls.append((op, ids, [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]))
        elif op == "decode":
            calls.append((op, ids, torch.randint(0, vocab, (len(ids),), generator=gen)))
        else:
            calls.append((op, ids, None))
    return calls


@pytest.fixture(scope="module")
def script_and_expected(tiny_config, sharp_weights):
    """The calls and, per call, the reference's last-token logits of each id over its history."""
    ref = ReferenceModel(tiny_config, sharp_weights, "cpu")
    calls = materialize_script(tiny_config["vocab_size"])
    history, expected = {}, []
    for op, ids, tokens in calls:
        if op == "remove":
            for rid in ids:
                del history[rid]
            expected.append(None)
            continue
        for i, rid in enumerate(ids):
            if op == "prefill":
                history[rid] = tokens[i]
            else:
                history[rid] = torch.cat([history[rid], tokens[i : i + 1]])
        expected.append(torch.stack([ref.forward(history[r][None])[0, -1] for r in ids]))
    return calls, expected


def run(engine, op, ids, tokens):
    if op == "remove":
        return engine.remove(ids)
    return getattr(engine, op)(ids, tokens)


@pytest.mark.parametrize("variant", ENGINE_VARIANTS, ids=[v.name for v in ENGINE_VARIANTS])
def test_matches_the_reference(tiny_config, sharp_weights, script_and_expected, variant):
    calls, expected = script_and_expected
    engine = build_engine(tiny_config, sharp_weights, "cpu", variant)
    worst = 0.0
    for step, ((op, ids, tokens), want) in enumerate(zip(calls, expected)):
        out = run(engine, op, ids, tokens)
        if op == "remove":
            assert out is None
            assert not set(ids) & set(engine.lengths)
            continue
        assert out.shape == (len(ids), 256) and out.dtype == torch.float32
        err = (out - want).abs().max().item()
        worst = max(worst, err)
        assert err < TOL, f"step {step} {op} {ids}: max |d| {err:.3g}"
    assert engine.lengths == {A: 7, C: 75, D: 20, B: 5}
    print(f"{variant.name}: max |d| vs reference {worst:.2e}")


@pytest.mark.parametrize(
    "variant",
    [
        Variant(cache="slab"),
        Variant(cache="paged", block_size=16),
        Variant(cache="paged", block_size=64),
    ],
    ids=lambda v: v.name,
)
def test_pool_growth_with_live_requests(tiny_config, sharp_weights, script_and_expected, variant):
    """A pool sized for one token must grow (slab: one slot, paged: one block) several times
    while requests are live; what they hold must survive every reallocation."""
    calls, expected = script_and_expected
    variant = dataclasses.replace(variant, cache_tokens=1)
    engine = build_engine(tiny_config, sharp_weights, "cpu", variant)
    # Fillers that stay live: the script's requests come on top and force growth.
    engine.prefill([900, 901, 902], [torch.arange(n) for n in (30, 2, 17)])
    generation = engine.cache.generation
    for step, ((op, ids, tokens), want) in enumerate(zip(calls, expected)):
        out = run(engine, op, ids, tokens)
        if want is not None:
            assert (out - want).abs().max().item() < TOL, step
    assert engine.cache.generation > generation


def test_logits_are_fresh_float32_tensors(tiny_config, sharp_weights, script_and_expected):
    calls, expected = script_and_expected
    engine = build_engine(tiny_config, sharp_weights, "cpu", Variant(cache="paged"))
    first = run(engine, *calls[0])
    kept = first.clone()
    second = run(engine, *calls[1])
    assert first.dtype == second.dtype == torch.float32
    assert first.untyped_storage().data_ptr() != second.untyped_storage().data_ptr()
    assert torch.equal(first, kept)  # the next call did not overwrite it
    first.fill_(float("nan"))
    second.zero_()  # the caller owns what it got: changing it changes nothing inside
    for step in range(2, len(calls)):
        out = run(engine, *calls[step])
        if out is not None:
            assert torch.allclose(out, expected[step], atol=TOL, rtol=0), step


def test_calls_run_without_grad_whatever_the_caller_s_mode(tiny_config, tiny_weights):
    """Grad mode on: the engine turns it off for the call, and back on after; off (the grader
    times under no_grad): nothing to enter. Logits never carry a graph."""
    seen = []
    probe = variants.engine.without_grad(lambda: seen.append(torch.is_grad_enabled()))
    probe()
    with torch.no_grad():
        probe()
    assert seen == [False, False] and torch.is_grad_enabled()
    engine = build_engine(tiny_config, tiny_weights, "cpu", Variant(cache="slab"))
    engine.model.weights.embed.requires_grad_(True)
    out = engine.prefill([1], [torch.tensor([1, 2, 3])])
    assert not out.requires_grad and out.grad_fn is None and torch.is_grad_enabled()
    assert not engine.decode([1], torch.tensor([4])).requires_grad


def test_prefill_sends_only_last_tokens_through_the_head(tiny_config, tiny_weights):
    engine = build_engine(tiny_config, tiny_weights, "cpu", Variant())
    rows, head = [], engine.model.output_logits

    def spy(x, *args):
        rows.append(x.shape[0])
        return head(x, *args)

    engine.model.output_logits = spy
    gen = torch.Generator().manual_seed(0)
    engine.prefill([1, 2, 3], [torch.randint(0, 256, (n,), generator=gen) for n in (5, 40, 1)])
    engine.decode([3, 1], torch.tensor([1, 2]))
    assert rows == [3, 2]


def test_prefill_rows_follow_the_call_order(tiny_config, sharp_weights):
    engine = build_engine(tiny_config, sharp_weights, "cpu", Variant())
    gen = torch.Generator().manual_seed(1)
    p, q = torch.randint(0, 256, (6,), generator=gen), torch.randint(0, 256, (9,), generator=gen)
    both = engine.prefill([8, 5], [p, q])
    alone_q = engine.prefill([5], [q])
    alone_p = engine.prefill([8], [p])
    assert torch.allclose(both[0], alone_p[0], atol=1e-5)
    assert torch.allclose(both[1], alone_q[0], atol=1e-5)
    assert not torch.allclose(both[0], both[1], atol=1e-2)


def test_accepts_tensor_ids_and_int32_tokens(tiny_config, tiny_weights):
    engine = build_engine(tiny_config, tiny_weights, "cpu", Variant(cache="slab"))
    other = build_engine(tiny_config, tiny_weights, "cpu", Variant(cache="slab"))
    prompts = [torch.arange(7), torch.arange(3) + 100]
    a = engine.prefill(torch.tensor([4, 9]), [t.int() for t in prompts])
    b = other.prefill([4, 9], prompts)
    assert torch.equal(a, b)
    a = engine.decode(torch.tensor([9, 4]), torch.tensor([1, 2], dtype=torch.int32))
    b = other.decode([9, 4], torch.tensor([1, 2]))
    assert torch.equal(a, b)
    engine.remove(torch.tensor([4]))
    assert list(engine.lengths) == [9]


# ------------------------------------------------------------------ bad calls
E = 77  # a request at exactly max_position_embeddings tokens
NEW = 555


def tok(n: int, start: int = 1) -> torch.Tensor:
    return torch.arange(start, start + n) % 256


BAD_CALLS = {
    "decode_unknown_id": (
        lambda e: e.decode([A, 999], torch.tensor([1, 2])),
        KeyError,
        "unknown request id 999",
    ),
    "empty_prompt": (
        lambda e: e.prefill([A, NEW], [tok(4), torch.tensor([], dtype=torch.long)]),
        ValueError,
        f"request {NEW}: empty prompt",
    ),
    "prefill_token_over_vocab": (
        lambda e: e.prefill([A, NEW], [tok(3), torch.tensor([5, 256])]),
        ValueError,
        r"token id 256 is outside the vocabulary \[0, 256\)",
    ),
    "prefill_negative_token": (
        lambda e: e.prefill([NEW], [torch.tensor([-1, 3])]),
        ValueError,
        r"token id -1 is outside the vocabulary",
    ),
    "decode_token_over_vocab": (
        lambda e: e.decode([A, B], torch.tensor([3, 256])),
        ValueError,
        r"decode: token id 256 is outside the vocabulary",
    ),
    "prompt_longer_than_max_positions": (
        lambda e: e.prefill([A], [tok(513)]),
        ValueError,
        "prompt of 513 tokens exceeds max_position_embeddings 512",
    ),
    "decode_beyond_max_positions": (
        lambda e: e.decode([A, E], torch.tensor([1, 2])),
        ValueError,
        f"request {E}: decoding past max_position_embeddings 512",
    ),
    "prefill_ids_prompts_mismatch": (
        lambda e: e.prefill([A, NEW], [tok(3)]),
        ValueError,
        "2 request ids but 1 prompts",
    ),
    "decode_ids_tokens_mismatch": (
        lambda e: e.decode([A, B], torch.tensor([1])),
        ValueError,
        r"one id per request \(2\), got shape \[1\]",
    ),
    "decode_2d_tokens": (
        lambda e: e.decode([A, B], torch.tensor([[1], [2]])),
        ValueError,
        r"must be 1-D .* got shape \[2, 1\]",
    ),
    "prefill_duplicate_ids": (
        lambda e: e.prefill([NEW, NEW], [tok(2), tok(3)]),
        ValueError,
        rf"duplicate request id\(s\) in one call: \[{NEW}\]",
    ),
    "decode_duplicate_ids": (
        lambda e: e.decode([A, A], torch.tensor([1, 2])),
        ValueError,
        rf"duplicate request id\(s\) in one call: \[{A}\]",
    ),
    "remove_duplicate_ids": (
        lambda e: e.remove([A, A]),
        ValueError,
        r"duplicate request id\(s\)",
    ),
    "prefill_float_tokens": (
        lambda e: e.prefill([NEW], [torch.tensor([1.0, 2.0])]),
        ValueError,
        f"request {NEW}: token ids must be an integer tensor, got torch.float32",
    ),
    "decode_float_tokens": (
        lambda e: e.decode([A], torch.tensor([1.0])),
        ValueError,
        "token ids must be an integer tensor, got torch.float32",
    ),
    "prefill_2d_prompt": (
        lambda e: e.prefill([NEW], [tok(6).view(2, 3)]),
        ValueError,
        r"prompt must be 1-D, got shape \[2, 3\]",
    ),
    "remove_unknown_id": (
        lambda e: e.remove([A, 999]),
        KeyError,
        r"unknown request id\(s\) \[999\]",
    ),
    "prefill_no_requests": (lambda e: e.prefill([], []), ValueError, "no requests"),
    "decode_no_requests": (
        lambda e: e.decode([], torch.tensor([], dtype=torch.long)),
        ValueError,
        "no requests",
    ),
}
BAD_CALL_LAYOUTS = [Variant(cache="contiguous"), Variant(cache="slab"), Variant(cache="paged")]


def set_up(engine) -> None:
    """A (9 tokens, then one decode), B (30) and E (exactly max positions) are live."""
    engine.prefill([A, B, E], [tok(9), tok(30, 50), tok(512, 7)])
    engine.decode([A], torch.tensor([17]))


def bookkeeping(engine) -> dict:
    cache = engine.cache
    state = {"lengths": dict(engine.lengths)}
    for name in ("slot_of", "table"):
        if hasattr(cache, name):
            state[name] = {
                k: list(v) if isinstance(v, list) else v for k, v in getattr(cache, name).items()
            }
    for name in ("free_slots", "free_blocks"):
        if hasattr(cache, name):
            state[name] = sorted(getattr(cache, name))
    if hasattr(cache, "store"):
        state["store"] = {k: tuple(kv[0].shape) for k, kv in cache.store.items()}
    return state


@pytest.fixture(scope="module")
def clean_runs(tiny_config, sharp_weights):
    """Per layout: bookkeeping after set-up, and the next decode of A and B."""
    runs = {}
    for variant in BAD_CALL_LAYOUTS:
        engine = build_engine(tiny_config, sharp_weights, "cpu", variant)
        set_up(engine)
        state = bookkeeping(engine)
        runs[variant.cache] = (state, engine.decode([B, A], torch.tensor([5, 6])))
    return runs


@pytest.mark.parametrize("check", ["first", "deferred"])
@pytest.mark.parametrize("variant", BAD_CALL_LAYOUTS, ids=lambda v: v.cache)
@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_call_raises_and_changes_nothing(
    tiny_config, sharp_weights, clean_runs, variant, name, check, patch_engine
):
    """`deferred`: the token-range check as a CUDA engine runs it for ids on the GPU, read after
    the forward pass, its state changes undone on a bad id."""
    call, error, message = BAD_CALLS[name]
    engine = build_engine(tiny_config, sharp_weights, "cpu", variant)
    set_up(engine)
    if check == "deferred":
        engine.check_device_tokens = False
        patch_engine(engine, "token_ids_on_host", lambda ids: False)
    with pytest.raises(error, match=message):
        call(engine)
    state, logits = clean_runs[variant.cache]
    assert bookkeeping(engine) == state
    assert torch.equal(engine.decode([B, A], torch.tensor([5, 6])), logits)
    assert engine.lengths[E] == 512


@pytest.mark.gpu
@pytest.mark.parametrize("layers", ["torch", "fused"])
def test_gpu_ids_on_the_device_are_checked_after_the_launch(tmp_path, layers):
    """A CUDA engine reads the range of ids on the GPU after queueing the call (graphs here):
    a bad id still raises by name, and the call's state changes are undone, so the next calls
    give exactly what an engine that never saw the bad call gives."""
    import json
    from pathlib import Path

    from evaluator.toy_weights import save_toy_weights

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    config = json.loads((Path(__file__).parents[2] / "target/model_config.json").read_text())
    save_toy_weights(config, tmp_path / "model.pt")
    vocab = config["vocab_size"]
    variant = Variant(cache="paged", block_size=64, attention="triton", layers=layers,
                      graphs="pow2", prefill_graphs="pow2")  # fmt: skip
    hit, clean = (build_engine(config, str(tmp_path), "cuda", variant) for _ in range(2))
    prompts = [torch.arange(n, device="cuda") * 7 % vocab for n in (63, 64, 5)]
    for e in (hit, clean):
        e.prefill([1, 2, 3], prompts)
    blocks = sorted(hit.cache.free_blocks)
    bad_prompt = torch.tensor([4, vocab, 9], device="cuda")
    with pytest.raises(ValueError, match=f"prefill of \\[7, 8\\]: token id {vocab} is outside"):
        hit.prefill([7, 8], [prompts[2], bad_prompt])
    assert sorted(hit.lengths) == [1, 2, 3] and sorted(hit.cache.free_blocks) == blocks
    with pytest.raises(ValueError, match="decode: token id -2 is outside"):
        hit.decode([3, 1, 2], torch.tensor([5, -2, 6], device="cuda"))  # 2 crosses into a new block
    assert hit.lengths == {1: 63, 2: 64, 3: 5}
    for step in range(3):
        tokens = torch.tensor([step, 11, 12], device="cuda")
        assert torch.equal(hit.decode([3, 1, 2], tokens), clean.decode([3, 1, 2], tokens))
    fresh = [torch.tensor([3, 1, 4], device="cuda")]
    assert torch.equal(hit.prefill([7], fresh), clean.prefill([7], fresh))


def test_a_refused_decode_across_a_block_gives_the_block_back(
    tiny_config, sharp_weights, patch_engine
):
    """The deferred check (as for ids on a GPU) refusing a decode that took a new block."""
    engine = build_engine(tiny_config, sharp_weights, "cpu", Variant(cache="paged", block_size=16))
    engine.check_device_tokens = False
    patch_engine(engine, "token_ids_on_host", lambda ids: False)
    engine.prefill([1, 2], [tok(16), tok(5)])
    state = bookkeeping(engine)
    with pytest.raises(ValueError, match="decode: token id 300 is outside"):
        engine.decode([2, 1], torch.tensor([4, 300]))
    assert bookkeeping(engine) == state
