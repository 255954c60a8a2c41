"""A trace as data: frozen ops (`Prefill`, `Decode`, `Remove`) in a `Trace`, `replay` and
`validate` over it, and `materialize`, which turns it into concrete engine calls with seeded token
tensors already on the device. The traces themselves: `evaluator.correctness_traces` (what is
checked) and `evaluator.benchmark_traces` (what is timed, and any trace by name).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch


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
