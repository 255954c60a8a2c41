"""Every trace, defined once: correctness cases, the public and hidden-like benchmarks, serving.

A trace is data (frozen ops); `materialize` turns it into concrete engine calls with seeded token
tensors already on the device. Tests, the search and the benchmarks all read traces from here.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

LARGE_ID_BASE = 10**9


def _ints(values) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


@dataclass(frozen=True)
class Prefill:
    ids: tuple[int, ...]
    lengths: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "ids", _ints(self.ids))
        object.__setattr__(self, "lengths", _ints(self.lengths))
        if len(self.ids) != len(self.lengths):
            raise ValueError(f"prefill of {len(self.ids)} ids with {len(self.lengths)} lengths")


@dataclass(frozen=True)
class Decode:
    ids: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "ids", _ints(self.ids))


@dataclass(frozen=True)
class Remove:
    ids: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "ids", _ints(self.ids))


Op = Prefill | Decode | Remove


@dataclass(frozen=True)
class Trace:
    name: str
    ops: tuple[Op, ...]
    description: str = field(default="", compare=False)

    def __post_init__(self):
        object.__setattr__(self, "ops", tuple(self.ops))

    @property
    def prefill_tokens(self) -> int:
        return sum(sum(op.lengths) for op in self.ops if isinstance(op, Prefill))

    @property
    def decode_tokens(self) -> int:
        return sum(len(op.ids) for op in self.ops if isinstance(op, Decode))

    @property
    def num_requests(self) -> int:
        """Prefilled prompts (a re-prefill of a live id counts again)."""
        return sum(len(op.ids) for op in self.ops if isinstance(op, Prefill))


# --- replay: one walk over a trace, used for validation and by the floor model ----------------


def replay(trace: Trace, max_positions: int | None = None) -> Iterator[tuple[Op, tuple[int, ...]]]:
    """Yield `(op, lengths)`: each id's sequence length after the op (empty for a removal).

    Raises ValueError on an invalid trace: duplicate ids in one op, an empty prompt, a decode or
    removal of an id that is not live, or a sequence longer than `max_positions`.
    """
    live: dict[int, int] = {}
    for step, op in enumerate(trace.ops):
        where = f"{trace.name} op {step} ({type(op).__name__.lower()})"
        if len(set(op.ids)) != len(op.ids):
            raise ValueError(f"{where}: duplicate ids {op.ids}")
        if not op.ids:
            raise ValueError(f"{where}: no ids")
        if isinstance(op, Prefill):
            if min(op.lengths) < 1:
                raise ValueError(f"{where}: empty prompt")
            live.update(zip(op.ids, op.lengths, strict=True))
        else:
            missing = [i for i in op.ids if i not in live]
            if missing:
                raise ValueError(f"{where}: ids {missing} are not live")
            if isinstance(op, Decode):
                for i in op.ids:
                    live[i] += 1
            else:
                for i in op.ids:
                    del live[i]
                yield op, ()
                continue
        lengths = tuple(live[i] for i in op.ids)
        if max_positions is not None and max(lengths) > max_positions:
            raise ValueError(f"{where}: length {max(lengths)} > max positions {max_positions}")
        yield op, lengths


def validate(trace: Trace, max_positions: int | None = None) -> Trace:
    """The trace itself when `replay` finds nothing wrong (raises ValueError otherwise)."""
    for _ in replay(trace, max_positions):
        pass
    return trace


# --- correctness traces -----------------------------------------------------------------------


def public_correctness() -> Trace:
    """The course's public correctness sequence (tokens: seed 7, on the device)."""
    ops = (
        Prefill([0], [11]),
        Decode([0]),
        Prefill([1, 2], [7, 13]),
        Decode([0, 1, 2]),
        Remove([1]),
        Prefill([3], [5]),
        Decode([0, 2, 3]),
        Remove([0, 2, 3]),
    )
    return Trace("public_correctness", ops, "the course's public correctness sequence")


class _Schedule:
    """Builds a valid trace while tracking live lengths, so random choices stay legal."""

    def __init__(self, max_positions: int, rng: random.Random):
        self.max_positions = max_positions
        self.rng = rng
        self.live: dict[int, int] = {}
        self.ops: list[Op] = []

    def prefill(self, ids: list[int], lengths: list[int]) -> None:
        self.ops.append(Prefill(ids, lengths))
        self.live.update(zip(ids, lengths, strict=True))

    def decode(self, ids: list[int]) -> None:
        self.ops.append(Decode(ids))
        for i in ids:
            self.live[i] += 1

    def remove(self, ids: list[int]) -> None:
        self.ops.append(Remove(ids))
        for i in ids:
            del self.live[i]

    def decode_random_subset(self, must: tuple[int, ...] = ()) -> None:
        """Decode a random non-empty subset of the requests with room left, in random order."""
        room = [i for i, n in self.live.items() if n < self.max_positions and i not in must]
        chosen = self.rng.sample(room, self.rng.randint(0 if must else 1, len(room)))
        ids = list(must) + chosen
        self.rng.shuffle(ids)
        self.decode(ids)


def stress(config: dict, seed: int = 0) -> Trace:
    """Random lengths, random decode subsets and orders, removals, a re-prefill of a live id and
    of a removed id, a prompt that decodes up to exactly `max_position_embeddings`, a batch of 33
    requests, large unsorted ids (10**9 + k). Sizes scale with `max_position_embeddings`.
    """
    max_pos = int(config["max_position_embeddings"])
    if max_pos < 16:
        raise ValueError(f"stress needs max_position_embeddings >= 16, got {max_pos}")
    rng = random.Random(seed)
    s = _Schedule(max_pos, rng)
    fresh_ids = iter(LARGE_ID_BASE + k for k in rng.sample(range(1, 10**6), 200))
    new = lambda n: [next(fresh_ids) for _ in range(n)]
    long_len = min(384, max_pos - 32)  # "several hundred" tokens, with room for decodes
    rand_len = lambda hi: rng.randint(1, max(1, min(hi, long_len)))

    # Mixed lengths, a one-token prompt among them; decodes of random subsets.
    lengths = [1, rand_len(long_len), rand_len(long_len)]
    rng.shuffle(lengths)
    s.prefill(new(3), lengths)
    for _ in range(3):
        s.decode_random_subset()
    # Very different lengths in one batch (padding bugs show here).
    lengths = [rand_len(16), long_len, rand_len(long_len)]
    rng.shuffle(lengths)
    s.prefill(new(3), lengths)
    for _ in range(3):
        s.decode_random_subset()
    removed = rng.sample(sorted(s.live), 2)
    s.remove(removed)
    # Re-prefill of the longest live request (state replaced by a shorter prompt), a removed id
    # coming back, and a new id, in random order.
    again = max(s.live, key=s.live.get)
    batch = [(again, rand_len(s.live[again] - 1)), (removed[0], rand_len(64)), (new(1)[0], 9)]
    rng.shuffle(batch)
    s.prefill([i for i, _ in batch], [n for _, n in batch])
    s.decode_random_subset(must=(again,))
    for _ in range(2):
        s.decode_random_subset()
    # A prompt near the limit, decoded up to exactly max_position_embeddings.
    near, steps = new(1)[0], 4
    s.prefill([near], [max_pos - steps])
    for _ in range(steps):
        s.decode_random_subset(must=(near,))
    assert s.live[near] == max_pos
    ids = list(s.live)
    rng.shuffle(ids)
    s.remove(ids)
    # A wide batch: 33 at once (over a power of two), decoded whole, then 32 of them.
    wide = new(33)
    s.prefill(wide, [rand_len(min(48, max_pos // 8)) for _ in wide])
    for _ in range(2):
        rng.shuffle(wide)
        s.decode(list(wide))
    s.decode(rng.sample(wide, 32))
    rng.shuffle(wide)
    s.remove(wide)
    desc = f"randomised stress (seed {seed}, max positions {max_pos})"
    return Trace("stress", tuple(s.ops), desc)


# --- benchmark traces -------------------------------------------------------------------------


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


# --- materialize ------------------------------------------------------------------------------


def materialize(trace: Trace, vocab_size: int, device: str | torch.device, seed: int = 0) -> list:
    """Concrete calls: `("prefill", ids, [1-D long tensors])`, `("decode", ids, 1-D long
    tensor)`, `("remove", ids)`. Tokens come from a seeded CPU generator, then move to the
    device, so CPU and GPU runs see the same tokens.
    """
    gen = torch.Generator().manual_seed(seed)
    draw = lambda n: torch.randint(0, vocab_size, (n,), generator=gen, dtype=torch.long)
    calls: list = []
    for op in trace.ops:
        ids = list(op.ids)
        if isinstance(op, Prefill):
            calls.append(("prefill", ids, [draw(n).to(device) for n in op.lengths]))
        elif isinstance(op, Decode):
            calls.append(("decode", ids, draw(len(ids)).to(device)))
        else:
            calls.append(("remove", ids))
    return calls
