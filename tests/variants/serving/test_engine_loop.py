"""The engine thread: requests submitted from other threads get the scheduler's tokens through
their callbacks, one event per step; cancel frees a request; close fails what is left."""

import queue
import threading

import pytest
import torch

from variants import Variant, build_engine
from variants.serving.engine_loop import EngineLoop
from variants.serving.scheduler import ContinuousBatchScheduler, ServingRequest


@pytest.fixture(scope="module")
def engine(tiny_config, tiny_weights):
    return build_engine(tiny_config, tiny_weights, "cpu", Variant())


def _collect(events: queue.Queue) -> tuple:
    tokens = []
    while True:
        event = events.get(timeout=30)
        tokens += event.tokens
        if event.finish_reason:
            return tokens, event.finish_reason, event.error


def test_requests_from_threads_get_the_tokens_of_the_scheduler(engine):
    prompts = [[5, 6, 7], [1] * 20, [9], [3, 4]]
    alone = [ServingRequest(i, torch.tensor(p), 6) for i, p in enumerate(prompts)]
    ContinuousBatchScheduler(engine, max_live=1).run(alone)
    eos = alone[3].output[2]
    loop = EngineLoop(engine, max_live=3).start()
    results = [None] * len(prompts)

    def client(i):
        events = queue.Queue()
        loop.submit(prompts[i], 6, events.put, eos_ids={eos} if i == 3 else ())
        results[i] = _collect(events)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, r in enumerate(alone[:3]):
        assert results[i] == (r.output, "length", None)
    stop = alone[3].output.index(eos) + 1
    assert results[3] == (alone[3].output[:stop], "stop", None)
    loop.close()
    assert not loop.alive and engine.lengths == {}


def test_cancel_frees_the_request_and_close_fails_the_rest(engine):
    loop = EngineLoop(engine, max_live=1).start()
    first, second = queue.Queue(), queue.Queue()
    rid = loop.submit([1, 2], 10_000, first.put)
    loop.submit([3], 10_000, second.put)  # waits: one live request at a time
    first.get(timeout=30)
    loop.cancel(rid)
    second.get(timeout=30)  # admitted once the first left
    loop.close()
    tokens, reason, error = _collect(second)
    assert (reason, error) == ("error", "the server is shutting down")
    assert engine.lengths == {}
    with pytest.raises(RuntimeError, match="closed"):
        loop.submit([1], 1, print)
