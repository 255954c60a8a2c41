"""The timed traces: the public benchmarks, the hidden-like ones the public set lacks, and the
serving suite (continuous batching, a wide decode, long prompts); `SUITES` by name, and `get_trace`
for any trace, correctness ones included.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from evaluator.correctness_traces import public_correctness, stress
from evaluator.traces import Decode, Op, Prefill, Remove, Trace


def _prefill_then_decode(name: str, batch: int, prompt: int, steps: int, desc: str) -> Trace:
    ids = list(range(batch))
    ops = [Prefill(ids, [prompt] * batch), *[Decode(ids) for _ in range(steps)], Remove(ids)]
    return Trace(name, tuple(ops), desc)


def _mixed(name: str, long_prompt: int, mid_prompt: int, short_prompt: int) -> Trace:
    """The public mixed schedule. Ids are given in arrival order (0-3, then 4-5, then 6-9);
    "decode N" takes the N lowest live ids and "remove 2" removes the two lowest live ids
    (0 and 1), so decode 6 = ids 0-5 and decode 8 = ids 2-9.
    """
    ops = (
        Prefill([0, 1, 2, 3], [mid_prompt] * 4),
        Decode([0, 1, 2, 3]),
        Decode([0, 1, 2, 3]),
        Prefill([4, 5], [long_prompt] * 2),
        Decode([0, 1, 2, 3, 4, 5]),
        Remove([0, 1]),
        Prefill([6, 7, 8, 9], [short_prompt] * 4),
        Decode([2, 3, 4, 5, 6, 7, 8, 9]),
        Decode([2, 3, 4, 5, 6, 7, 8, 9]),
        Remove([2, 3, 4, 5, 6, 7, 8, 9]),
    )
    return Trace(name, ops, f"mixed: prompts {mid_prompt}/{long_prompt}/{short_prompt}")


def public_benchmarks() -> tuple[Trace, ...]:
    """The three traces the public evaluator times: prefill, decode, mixed."""
    return (
        _prefill_then_decode("prefill", 4, 128, 0, "prefill 4x128, remove"),
        _prefill_then_decode("decode", 8, 32, 16, "prefill 8x32, 16 decode steps of all 8"),
        _mixed("mixed", 128, 64, 32),
    )


def hidden_like() -> tuple[Trace, ...]:
    """The hidden traces students saw that the public set lacks."""
    return (
        _prefill_then_decode("decode_8x128", 8, 128, 16, "prefill 8x128, 16 decode steps of all 8"),
        _mixed("mixed_128", 128, 128, 128),
    )


def _continuous(config: dict, seed: int, n_requests: int = 100, max_live: int = 32) -> Trace:
    """Requests with prompts 16..1024 and 8..256 decode steps arrive in a queue; free slots are
    filled by one prefill batch, every live request decodes each step, finished ones are removed.
    Prompts are clipped so prompt + decode steps <= max_position_embeddings.
    """
    max_pos = int(config["max_position_embeddings"])
    rng = random.Random(seed)
    queue = []
    for rid in range(n_requests):
        steps = min(rng.randint(8, 256), max_pos - 1)
        prompt = max(1, min(rng.randint(16, 1024), max_pos - steps))
        queue.append((rid, prompt, steps))
    queue.reverse()
    remaining: dict[int, int] = {}
    ops: list[Op] = []
    while queue or remaining:
        admitted = [queue.pop() for _ in range(min(max_live - len(remaining), len(queue)))]
        if admitted:
            ops.append(Prefill([r for r, _, _ in admitted], [p for _, p, _ in admitted]))
            remaining.update((r, n) for r, _, n in admitted)
        ids = sorted(remaining)
        ops.append(Decode(ids))
        for i in ids:
            remaining[i] -= 1
        finished = [i for i in ids if remaining[i] == 0]
        if finished:
            ops.append(Remove(finished))
            for i in finished:
                del remaining[i]
    desc = f"continuous batching: {n_requests} requests, <= {max_live} live (seed {seed})"
    return Trace("continuous", tuple(ops), desc)


def serving_suite(config: dict, seed: int = 0) -> tuple[Trace, ...]:
    """Serving-style traces: continuous batching, a wide decode, long prompts (when they fit)."""
    max_pos = int(config["max_position_embeddings"])
    steps = min(128, max_pos // 2)
    prompt = min(256, max_pos - steps)
    traces = [
        _continuous(config, seed),
        _prefill_then_decode(
            "wide_decode", 64, prompt, steps, f"prefill 64x{prompt}, {steps} decode steps of all"
        ),
    ]
    if max_pos >= 2048 + 16:
        traces.append(
            _prefill_then_decode("long_prompts", 4, 2048, 16, "prefill 4x2048, 16 decode steps")
        )
    return tuple(traces)


SUITES: dict[str, Callable[[dict], tuple[Trace, ...]]] = {
    "public": lambda config: public_benchmarks(),
    "hidden": lambda config: hidden_like(),
    "serving": serving_suite,
}


def get_trace(name: str, config: dict) -> Trace:
    """Any trace by name: a benchmark of any suite, `public_correctness` or `stress`."""
    traces = [public_correctness(), stress(config)]
    for make in SUITES.values():
        traces.extend(make(config))
    for trace in traces:
        if trace.name == name:
            return trace
    raise KeyError(f"unknown trace {name!r}; known: {', '.join(t.name for t in traces)}")
