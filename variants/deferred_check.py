"""The token-range check of a call whose ids live on the GPU, read after the call's kernels are
queued.

Reading the ids' min and max before the forward pass makes the host wait for everything queued
before it (the previous step's graph, say) and leaves the GPU idle while the host then builds
the call's index lists. Instead the engine queues the min/max with a copy into pinned memory,
clamps the ids it runs with (a bad id then cannot set off a device-side assert), launches the
forward pass, and reads the answer last: that read waits only for work queued before the call.
A bad id then raises like the synchronous check, after the engine has undone the call's state
changes (new requests released, decoded lengths restored)."""

import torch

from variants.staging import stream_index


def range_error(lo: int, hi: int, vocab: int, what: str) -> str | None:
    """The message for token ids spanning [lo, hi] outside [0, vocab), else None."""
    if lo >= 0 and hi < vocab:
        return None
    bad = lo if lo < 0 else hi
    return f"{what}: token id {bad} is outside the vocabulary [0, {vocab})"


class DeferredRangeCheck:
    """One check in flight at a time: `start` queues it, `error` waits for it and returns the
    message of a bad id (None when every id is in range)."""

    def __init__(self, device: torch.device):
        device = torch.device(device)
        cuda = device.type == "cuda"
        self.extremes = torch.zeros(2, dtype=torch.long, device=device)
        self.lo, self.hi = self.extremes[0], self.extremes[1]  # views made once: ~5 us a call
        self.host = torch.zeros(2, dtype=torch.long, pin_memory=cuda)
        self.event = torch.cuda.Event() if cuda else None
        self.index = stream_index(device)

    def start(self, tokens: torch.Tensor) -> None:
        torch.aminmax(tokens, out=(self.lo, self.hi))
        self.host.copy_(self.extremes, non_blocking=True)
        if self.event is not None:
            self.event.record(torch.cuda.current_stream(self.index))

    def error(self, vocab: int, what: str) -> str | None:
        if self.event is not None:
            self.event.synchronize()  # the min/max were queued before the call's own kernels
        lo, hi = self.host.tolist()
        return range_error(lo, hi, vocab, what)
