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
            eos_ids=frozenset() if eos is None else frozenset([eos]),
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


class FailingEngine(CountingEngine):
    """The real engine, raising for any call holding request `bad` once it has been decoded
    `after` times: after the call ran, as a bug or an out-of-memory could."""

    def __init__(self, engine, bad, after=0):
        super().__init__(engine)
        self.bad, self.after = bad, after

    def _check(self, ids, out):
        if self.bad in ids and self.after <= 0:
            raise RuntimeError("boom")
        return out

    def prefill(self, ids, prompts):
        return self._check(ids, super().prefill(ids, prompts))

    def decode(self, ids, tokens):
        out = self._check(ids, super().decode(ids, tokens))
        self.after -= self.bad in ids
        return out


@pytest.mark.parametrize("after", [0, 2])
def test_a_failing_request_fails_alone_and_the_others_keep_their_tokens(engine, tiny_config, after):
    vocab = tiny_config["vocab_size"]
    expected = _requests(4, vocab, max_new=(6,))
    ContinuousBatchScheduler(engine, max_live=4).run(expected)
    failing = FailingEngine(engine, bad=101, after=after)
    requests = _requests(4, vocab, max_new=(6,))
    ContinuousBatchScheduler(failing, max_live=4).run(requests)
    bad = requests[1]
    assert bad.finish_reason == "error" and bad.error == "RuntimeError: boom"
    assert bad.output == expected[1].output[: after + 1 if after else 0]
    for r, e in zip(requests, expected):
        if r is not bad:
            assert r.finish_reason == "length" and r.output == e.output
    assert engine.lengths == {}  # the failed request's state too was removed


def test_per_request_samplers_and_cancel(engine, tiny_config):
    vocab = tiny_config["vocab_size"]
    greedy = _requests(3, vocab, max_new=(5,))
    ContinuousBatchScheduler(engine).run(greedy)
    requests = _requests(3, vocab, max_new=(5,))
    requests[1].sampler = TokenSampler(SamplingParams(temperature=1.0), seed=7)
    sched = ContinuousBatchScheduler(engine, max_live=2)
    for r in requests:
        sched.add(r)
    sched.step()  # 100 and 101 run, 102 waits
    assert sched.cancel(101) and sched.cancel(102) and not sched.cancel(101)
    assert set(engine.lengths) == {100}
    while not sched.idle:
        sched.step()
    assert requests[0].output == greedy[0].output and requests[2].output == []
    assert len(requests[1].output) == 1 and engine.lengths == {}
