"""The token-range check of a call whose ids live on the GPU, read after the call's kernels are
queued.

Reading the ids' min and max before the forward pass makes the host wait for everything queued
before it (the previous step's graph, say) and leaves the GPU idle while the host then builds
the call's index lists. Instead the engine queues the min/max with a copy into pinned memory,
clamps the ids it runs with (a bad id then cannot set off a device-side assert), launches the
forward pass, and reads the answer last: that read waits only for work queued before the call.
A bad id then raises like the synchronous check, after the engine has undone the call's state
changes (new requests released, decoded lengths restored).

A CUDA graph can run the check itself (`in_graph`): its min/max, copy and event then sit inside
the graph, where they cost no launches of their own. The event must then be an external one, a
node of the graph recorded at each replay, so the read still waits only for the check and not for
the whole step (the check ends early in the graph, the step much later). The Triton stacks' graphs
write the extremes from a kernel straight into the pinned buffer instead (the gathered embedding's
kernel, then `record_written`): the min/max, copy node and clamp held the first layer back."""

import inspect

import torch


def range_error(lo: int, hi: int, vocab: int, what: str) -> str | None:
    """The message for token ids spanning [lo, hi] outside [0, vocab), else None."""
    if lo >= 0 and hi < vocab:
        return None
    bad = lo if lo < 0 else hi
    return f"{what}: token id {bad} is outside the vocabulary [0, {vocab})"


def graph_events() -> bool:
    """Whether this PyTorch offers external CUDA events (`torch.cuda.Event(external=True)`), the
    ones a graph capture records as nodes of the graph (2.11 does; 2.3 does not)."""
    return "external" in inspect.signature(torch.cuda.Event.__new__).parameters


class DeferredRangeCheck:
    """One check in flight at a time: `start` queues it, `error` waits for it and returns the
    message of a bad id (None when every id is in range). `in_graph`: `start` may also be
    captured into a CUDA graph, where this PyTorch allows it (`self.in_graph` says whether)."""

    def __init__(self, device: torch.device, in_graph: bool = False):
        cuda = device.type == "cuda"
        self.in_graph = in_graph and (not cuda or graph_events())
        self.extremes = torch.zeros(2, dtype=torch.long, device=device)
        self.lo, self.hi = self.extremes[0], self.extremes[1]  # views made once: slices cost time
        self.host = torch.zeros(2, dtype=torch.long, pin_memory=cuda)
        external = {"external": True} if self.in_graph else {}  # (a graph's node: `in_graph`)
        self.event = torch.cuda.Event(**external) if cuda else None
        # an int (an engine's CUDA device has one) spares current_stream its lookup of the
        # device, host time paid on every call
        self.index = device.index

    def start(self, tokens: torch.Tensor) -> None:
        torch.aminmax(tokens, out=(self.lo, self.hi))
        self.host.copy_(self.extremes, non_blocking=True)
        if self.event is not None:
            self.event.record(torch.cuda.current_stream(self.index))

    def record_written(self) -> None:
        """The check's event alone, after a kernel of the current stream wrote the extremes
        straight into `host` (the gathered embedding's kernel)."""
        self.event.record(torch.cuda.current_stream(self.index))

    def wait(self) -> None:
        """Until the check last queued (or replayed in a graph) has run."""
        if self.event is not None:
            self.event.synchronize()

    def error(self, vocab: int, what: str) -> str | None:
        self.wait()  # the min/max were queued before the call's own kernels
        return range_error(*self.host.tolist(), vocab, what)  # (lo, hi)
