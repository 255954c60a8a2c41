"""Random and hostile call sequences against a model of the expected state (id -> history).

Hypothesis drives prefill / decode / remove with random ids (huge and negative too), lengths,
orders and subsets, and invalid calls that must raise a named error and change nothing. Every
row is checked against the reference over the request's full history. Engines are built once
per variant and emptied between examples."""

import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluator.reference_model import ReferenceModel
from evaluator.toy_weights import save_toy_weights
from variants import Variant, build_engine

CONFIG = json.loads((Path(__file__).parents[1] / "data" / "tiny_config.json").read_text())
VOCAB, MAX_POS = CONFIG["vocab_size"], CONFIG["max_position_embeddings"]
TOL = dict(atol=1e-3, rtol=1e-3)
VARIANTS = {
    v.name: v
    for v in (
        Variant(cache="slab", attention="sdpa"),
        Variant(cache="paged", block_size=16, attention="manual"),
        Variant(cache="contiguous", attention="sdpa", fuse_qkv=False, fuse_gate_up=False),
        Variant(cache="paged", block_size=16, attention="sdpa"),
        Variant(cache="slab", attention="manual"),
        Variant(cache="paged", block_size=16, prefix_cache=True),
    )
}
SETTINGS = dict(
    deadline=None,
    database=None,  # no .hypothesis folder in the repo
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ANY_ID = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The sharp tiny model, its reference and one engine per variant."""
    folder = tmp_path_factory.mktemp("hostile")
    save_toy_weights(CONFIG, folder / "model.pt", seed=99, qk_scale=12.0, head_scale=10.0)
    reference = ReferenceModel(CONFIG, folder, "cpu")
    engines = {name: build_engine(CONFIG, str(folder), "cpu", v) for name, v in VARIANTS.items()}
    return Expected(reference), engines


class Expected:
    """The reference's last-position logits of a history, memoised (histories repeat)."""

    def __init__(self, reference):
        self.reference, self.memo = reference, {}

    def logits(self, history: list) -> torch.Tensor:
        key = tuple(history)
        if key not in self.memo:
            self.memo[key] = self.reference.forward(torch.tensor([history]))[0, -1].float()
        return self.memo[key]

    def check(self, ids: list, out: torch.Tensor, histories: dict) -> None:
        assert out.shape == (len(ids), VOCAB) and out.dtype == torch.float32
        for row, rid in zip(out, ids):
            torch.testing.assert_close(row, self.logits(histories[rid]), **TOL)


def emptied(engine):
    engine.remove(list(engine.lengths))  # leftovers of an earlier failed example
    return engine


def tokens(draw, n: int) -> list:
    return draw(st.lists(st.integers(0, VOCAB - 1), min_size=n, max_size=n))


def do_prefill(data, engine, expected, histories):
    live = list(histories)
    reused = data.draw(st.lists(st.sampled_from(live), unique=True, max_size=2)) if live else []
    fresh = data.draw(st.lists(ANY_ID.filter(lambda r: r not in histories), max_size=3))
    ids = list(dict.fromkeys(reused + fresh)) or [data.draw(ANY_ID)]
    ids = data.draw(st.permutations(ids))
    lengths = [data.draw(st.integers(1, 24)) for _ in ids]
    prompts = [torch.tensor(tokens(data.draw, n)) for n in lengths]
    form = data.draw(st.sampled_from(["list", "tuple", "id_tensor", "int32"]))
    if form == "tuple":
        out = engine.prefill(tuple(ids), tuple(prompts))
    elif form == "id_tensor":
        out = engine.prefill(torch.tensor(ids, dtype=torch.long), prompts)
    elif form == "int32":
        out = engine.prefill(ids, [p.to(torch.int32) for p in prompts])
    else:
        out = engine.prefill(ids, prompts)
    for rid, p in zip(ids, prompts):
        histories[rid] = p.tolist()  # a re-prefill replaces the history
    expected.check(ids, out, histories)
    return out


def do_decode(data, engine, expected, histories):
    ids = data.draw(st.lists(st.sampled_from(list(histories)), min_size=1, unique=True))
    new = tokens(data.draw, len(ids))
    out = engine.decode(ids, torch.tensor(new))
    for rid, t in zip(ids, new):
        histories[rid].append(t)
    expected.check(ids, out, histories)
    return out


def do_remove(data, engine, histories):
    ids = data.draw(st.lists(st.sampled_from(list(histories)), unique=True))
    engine.remove(ids)
    for rid in ids:
        del histories[rid]


@pytest.mark.parametrize("name", list(VARIANTS))
@settings(max_examples=20, **SETTINGS)
@given(data=st.data())
def test_random_call_sequences_match_the_reference(world, name, data):
    expected, engines = world
    engine = emptied(engines[name])
    histories: dict = {}
    kept = []  # earlier outputs must never change under later calls
    for _ in range(data.draw(st.integers(1, 10), label="calls")):
        op = data.draw(
            st.sampled_from(["prefill", "decode", "remove"] if histories else ["prefill"])
        )
        if op == "prefill":
            out = do_prefill(data, engine, expected, histories)
            kept.append((out, out.clone()))
        elif op == "decode":
            out = do_decode(data, engine, expected, histories)
            kept.append((out, out.clone()))
        else:
            do_remove(data, engine, histories)
        assert sorted(engine.lengths) == sorted(histories)
    assert all(torch.equal(a, b) for a, b in kept)
    engine.remove(list(histories))


# ------------------------------------------------------------------ invalid calls
def hostile_calls(live: list, fresh: int) -> dict:
    """kind -> (call, exception type, message pattern) of bad calls, given the live ids and an
    id that is not live. Ids of a good request ride along, so a half-applied call would show."""
    a, n, ok = live[0], len(live), torch.ones(len(live), dtype=torch.long)
    prompt = torch.arange(3)
    return {
        "decode_unknown": (
            lambda e: e.decode([*live, fresh], torch.ones(n + 1, dtype=torch.long)),
            KeyError,
            f"unknown request id {fresh}",
        ),
        "decode_duplicate": (
            lambda e: e.decode([a, *live], torch.ones(n + 1, dtype=torch.long)),
            ValueError,
            "duplicate request id",
        ),
        "decode_out_of_vocab": (
            lambda e: e.decode(live, torch.full((n,), VOCAB)),
            ValueError,
            f"token id {VOCAB} is outside the vocabulary",
        ),
        "decode_negative_token": (
            lambda e: e.decode(live, torch.full((n,), -1)),
            ValueError,
            "token id -1 is outside the vocabulary",
        ),
        "decode_float_tokens": (
            lambda e: e.decode(live, ok.float()),
            ValueError,
            "must be an integer tensor",
        ),
        "decode_bool_tokens": (
            lambda e: e.decode(live, ok.bool()),
            ValueError,
            "must be an integer tensor",
        ),
        "decode_too_few_tokens": (
            lambda e: e.decode(live, ok[:-1]),
            ValueError,
            "one id per request",
        ),
        "decode_2d_tokens": (
            lambda e: e.decode(live, ok[:, None]),
            ValueError,
            "must be 1-D",
        ),
        "decode_nothing": (lambda e: e.decode([], ok[:0]), ValueError, "no requests"),
        "prefill_duplicate": (
            lambda e: e.prefill([a, fresh, a], [prompt] * 3),
            ValueError,
            "duplicate request id",
        ),
        "prefill_empty_prompt": (
            lambda e: e.prefill([a, fresh], [prompt, prompt[:0]]),
            ValueError,
            f"request {fresh}: empty prompt",
        ),
        "prefill_out_of_vocab": (
            lambda e: e.prefill([a, fresh], [prompt, torch.tensor([1, VOCAB + 5])]),
            ValueError,
            f"token id {VOCAB + 5} is outside",
        ),
        "prefill_float_prompt": (
            lambda e: e.prefill([a, fresh], [prompt, prompt.double()]),
            ValueError,
            "must be an integer tensor",
        ),
        "prefill_2d_prompt": (
            lambda e: e.prefill([a, fresh], [prompt, prompt[None]]),
            ValueError,
            "prompt must be 1-D",
        ),
        "prefill_too_long": (
            lambda e: e.prefill([a, fresh], [prompt, torch.zeros(MAX_POS + 1, dtype=torch.long)]),
            ValueError,
            "exceeds max_position_embeddings",
        ),
        "prefill_more_ids_than_prompts": (
            lambda e: e.prefill([a, fresh], [prompt]),
            ValueError,
            "2 request ids but 1 prompts",
        ),
        "prefill_more_prompts_than_ids": (
            lambda e: e.prefill([a], [prompt, prompt]),
            ValueError,
            "1 request ids but 2 prompts",
        ),
        "prefill_nothing": (lambda e: e.prefill([], []), ValueError, "no requests"),
        "prefill_2d_id_tensor": (
            lambda e: e.prefill(torch.tensor([[a]]), [prompt]),
            ValueError,
            "1-D and integer",
        ),
        "remove_unknown": (
            lambda e: e.remove([*live, fresh]),
            KeyError,
            f"unknown request id\\(s\\) \\[{fresh}\\]",
        ),
        "remove_duplicate": (lambda e: e.remove([a, a]), ValueError, "duplicate request id"),
    }


HOSTILE_KINDS = sorted(hostile_calls([0], 1))


@pytest.mark.parametrize("name", list(VARIANTS))
@settings(max_examples=30, **SETTINGS)
@given(data=st.data())
def test_bad_calls_raise_and_change_nothing(world, name, data):
    expected, engines = world
    engine = emptied(engines[name])
    histories: dict = {}
    do_prefill(data, engine, expected, histories)
    if data.draw(st.booleans(), label="decode first"):
        do_decode(data, engine, expected, histories)
    live = data.draw(st.permutations(list(histories)))
    fresh = data.draw(ANY_ID.filter(lambda r: r not in histories), label="unknown id")
    for kind in data.draw(st.lists(st.sampled_from(HOSTILE_KINDS), min_size=1, max_size=4)):
        call, exc_type, message = hostile_calls(live, fresh)[kind]
        with pytest.raises(exc_type, match=message):
            call(engine)
        assert sorted(engine.lengths) == sorted(histories), kind
    do_decode(data, engine, expected, histories)  # every request still where it was
    engine.remove(list(histories))


# ------------------------------------------------------------------ edges, deterministic
@pytest.fixture
def tiny_engine(world):
    expected, engines = world
    return expected, emptied(engines[next(iter(VARIANTS))])


def test_context_fills_exactly_to_max_positions_then_refuses(tiny_engine):
    expected, engine = tiny_engine
    history = {7: torch.randint(0, VOCAB, (MAX_POS - 1,)).tolist(), 8: [1, 2]}
    engine.prefill([7, 8], [torch.tensor(history[7]), torch.tensor(history[8])])
    out = engine.decode([8, 7], torch.tensor([3, 4]))  # request 7 reaches MAX_POS tokens
    history[8].append(3)
    history[7].append(4)
    expected.check([8, 7], out, history)
    with pytest.raises(ValueError, match="request 7: decoding past max_position_embeddings"):
        engine.decode([8, 7], torch.tensor([5, 6]))
    out = engine.decode([8], torch.tensor([5]))  # the other request is untouched
    history[8].append(5)
    expected.check([8], out, history)
    engine.remove([7, 8])


def test_removed_id_is_unknown_and_reusable(tiny_engine):
    expected, engine = tiny_engine
    engine.prefill([-5], [torch.tensor([1, 2, 3])])
    engine.remove([-5])
    with pytest.raises(KeyError, match="unknown request id -5"):
        engine.decode([-5], torch.tensor([1]))
    with pytest.raises(KeyError, match=r"unknown request id\(s\) \[-5\]"):
        engine.remove([-5])
    out = engine.prefill([-5], [torch.tensor([4, 5])])
    expected.check([-5], out, {-5: [4, 5]})
    engine.remove([-5])


def test_inputs_that_are_not_tensors(tiny_engine):
    """Plain lists of ints are accepted wherever the contract says tensor."""
    expected, engine = tiny_engine
    out = engine.prefill([1, 2], [[5, 6, 7], [8]])
    expected.check([1, 2], out, {1: [5, 6, 7], 2: [8]})
    out = engine.decode([2, 1], [9, 10])
    expected.check([2, 1], out, {1: [5, 6, 7, 10], 2: [8, 9]})
    engine.remove([1, 2])


def test_token_tensors_move_to_the_engine_device(tiny_engine):
    """A CPU engine takes tokens that live elsewhere (here: another dtype, non-contiguous)."""
    expected, engine = tiny_engine
    prompt = torch.arange(20)[::2]  # non-contiguous view
    out = engine.prefill([0], [prompt])
    expected.check([0], out, {0: prompt.tolist()})
    engine.remove([0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpu_tokens_for_a_gpu_engine_and_gpu_tokens_for_a_cpu_engine(world, tmp_path):
    """Token tensors move to the engine's device; logits come back on the engine's device.
    The GPU stream is kept busy first, so a device-to-host copy that does not wait for it
    (non_blocking into pinned memory) would hand the CPU engine unwritten tokens."""
    expected, engines = world
    save_toy_weights(CONFIG, tmp_path / "model.pt", seed=99, qk_scale=12.0, head_scale=10.0)
    variant = Variant(cache="paged", attention="sdpa", dtype="float32")
    gpu = build_engine(CONFIG, str(tmp_path), "cuda", variant)
    cpu = emptied(engines[next(iter(VARIANTS))])
    prompts = [torch.randint(1, VOCAB, (n,)) for n in (5, 9)]
    history = {0: prompts[0].tolist(), 1: prompts[1].tolist()}
    on_gpu = gpu.prefill([0, 1], prompts)  # CPU tokens into the GPU engine
    assert on_gpu.device.type == "cuda"
    expected.check([0, 1], on_gpu.cpu(), history)
    gpu_prompts = [p.cuda() for p in prompts]
    torch.cuda._sleep(1 << 30)  # about half a second of GPU work queued ahead of the copy
    on_cpu = cpu.prefill([0, 1], gpu_prompts)  # GPU tokens into the CPU engine
    assert on_cpu.device.type == "cpu"
    expected.check([0, 1], on_cpu, history)
    step = torch.tensor([3, 4])
    for rid, t in zip([1, 0], step.tolist()):
        history[rid].append(t)
    expected.check([1, 0], gpu.decode([1, 0], step).cpu(), history)
    gpu_step = step.cuda()
    torch.cuda._sleep(1 << 30)
    expected.check([1, 0], cpu.decode([1, 0], gpu_step), history)
    cpu.remove([0, 1])


@pytest.mark.parametrize("bad_id", [10.7, "10"])
def test_non_integer_ids_are_refused(tiny_engine, bad_id):
    """remove([10.7]) must not remove request 10."""
    _, engine = tiny_engine
    engine.prefill([10], [torch.tensor([1, 2])])
    try:
        with pytest.raises((ValueError, TypeError), match="integer"):
            engine.remove([bad_id])
        assert 10 in engine.lengths
    finally:
        emptied(engine)
