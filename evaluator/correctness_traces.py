"""The correctness traces: the course's public sequence and a seeded stress trace (random
lengths and decode subsets, re-prefills, the position limit, a wide batch, large ids). The
evaluator's `check_engine` compares every row of them with the reference.
"""

from __future__ import annotations

import random

from evaluator.traces import Decode, Op, Prefill, Remove, Trace

LARGE_ID_BASE = 10**9


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
