"""Continuous batching over the real engine of the tiny model: admission limits, exact lengths,
removal of finished requests, eos, timing records, and the same tokens as one-at-a-time decoding."""

import pytest
import torch

from variants import Variant, build_engine
from variants.serving.sampling import SamplingParams, TokenSampler
from variants.serving.scheduler import ContinuousBatchScheduler, RequestState, ServingRequest


@pytest.fixture(scope="module")
def engine(tiny_config, tiny_weights):
    return build_engine(tiny_config, tiny_weights, "cpu", Variant())


def _requests(n, vocab, max_new=(3, 7, 1, 5, 9), lengths=(5, 40, 12, 70, 3), eos=None):
    gen = torch.Generator().manual_seed(5)
    return [
        ServingRequest(
            100 + i,
            torch.randint(0, vocab, (lengths[i % len(lengths)],), generator=gen),
            max_new[i % len(max_new)],
            eos_id=eos,
        )
        for i in range(n)
    ]


class CountingEngine:
    """The real engine, with each call's ids recorded."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def prefill(self, ids, prompts):
        self.calls.append(("prefill", list(ids), sum(p.numel() for p in prompts)))
        return self.engine.prefill(ids, prompts)

    def decode(self, ids, tokens):
        self.calls.append(("decode", list(ids), len(ids)))
        return self.engine.decode(ids, tokens)

    def remove(self, ids):
        self.calls.append(("remove", list(ids), len(ids)))
        self.engine.remove(ids)


def test_every_request_finishes_with_exactly_max_new_tokens_within_limits(engine, tiny_config):
    counting = CountingEngine(engine)
    sched = ContinuousBatchScheduler(counting, max_live=3, prefill_token_budget=64)
    requests = _requests(10, tiny_config["vocab_size"])
    done = sched.run(requests)
    assert sorted(r.request_id for r in done) == [r.request_id for r in requests]
    for r in requests:
        assert r.state is RequestState.FINISHED and len(r.output) == r.max_new_tokens
        assert len(r.token_times_s) == r.max_new_tokens and r.ttft_s > 0
        assert len(r.token_latencies_s) == r.max_new_tokens - 1
    assert max(sched.live_per_step) <= 3 and max(sched.live_per_step) == 3
    live = set()
    for op, ids, n in counting.calls:
        if op == "prefill":
            live |= set(ids)
            assert n <= 64 or len(ids) == 1  # the budget, or one long prompt alone
        elif op == "decode":
            assert set(ids) <= live
        else:
            live -= set(ids)
        assert len(live) <= 3
    assert live == set() and engine.lengths == {}  # every finished request was removed
    removed = [i for op, ids, _ in counting.calls if op == "remove" for i in ids]
    assert sorted(removed) == sorted(r.request_id for r in requests)


def test_batched_tokens_equal_one_request_at_a_time(engine, tiny_config):
    vocab = tiny_config["vocab_size"]
    batched = _requests(6, vocab)
    ContinuousBatchScheduler(engine, max_live=4).run(batched)
    alone = _requests(6, vocab)
    ContinuousBatchScheduler(engine, max_live=1).run(alone)
    assert [r.output for r in batched] == [r.output for r in alone]


def test_eos_finishes_early_and_seeded_sampling_replays(engine, tiny_config):
    vocab = tiny_config["vocab_size"]
    probe = _requests(1, vocab, max_new=(6,))
    ContinuousBatchScheduler(engine).run(probe)
    eos = probe[0].output[2]
    again = _requests(1, vocab, max_new=(6,), eos=eos)
    ContinuousBatchScheduler(engine).run(again)
    stop = probe[0].output.index(eos) + 1  # eos may already come earlier than the third token
    assert stop <= 3 and again[0].output == probe[0].output[:stop]
    assert again[0].state is RequestState.FINISHED and engine.lengths == {}

    params = SamplingParams(temperature=1.0, top_p=0.9)
    runs = []
    for _ in range(2):
        reqs = _requests(4, vocab, max_new=(8,))
        ContinuousBatchScheduler(engine, TokenSampler(params, seed=3), max_live=2).run(reqs)
        runs.append([r.output for r in reqs])
    assert runs[0] == runs[1]


def test_fake_clock_gives_exact_ttft_and_token_latencies():
    class EchoEngine:
        def prefill(self, ids, prompts):
            return torch.zeros(len(ids), 8)

        def decode(self, ids, tokens):
            return torch.zeros(len(ids), 8)

        def remove(self, ids):
            pass

    ticks = iter(range(100))
    sched = ContinuousBatchScheduler(EchoEngine(), max_live=1, clock=lambda: float(next(ticks)))
    a = ServingRequest(1, torch.tensor([1, 2]), 3)
    b = ServingRequest(2, torch.tensor([3]), 2)
    sched.run([a, b])  # arrivals at t=0, 1; a: tokens at 2, 3, 4; b waits, then 5, 6
    assert a.ttft_s == 2.0 and a.token_latencies_s == [1.0, 1.0] and a.tpot_s == 1.0
    assert b.ttft_s == 4.0 and b.token_latencies_s == [1.0]
    assert sched.steps == 5


def test_bad_requests_raise():
    with pytest.raises(ValueError):
        ServingRequest(1, torch.tensor([1]), 0)
    with pytest.raises(ValueError):
        ServingRequest(1, torch.tensor([], dtype=torch.long), 1)
    sched = ContinuousBatchScheduler(None)
    sched.add(ServingRequest(1, torch.tensor([1]), 1))
    with pytest.raises(ValueError):
        sched.add(ServingRequest(1, torch.tensor([2]), 1))
