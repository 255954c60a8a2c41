"""Host-to-device staging for the small per-call index tensors (positions, slots, tables).

On CUDA a copy from pageable memory synchronises the stream; a copy from pinned memory with
`non_blocking=True` does not. `host_tensor` pins a fresh tensor per call (the eager paths);
`PinnedRing` keeps a few pinned buffers for the CUDA-graph paths, which stage every call."""

import array

import torch


def host_tensor(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def stream_index(device: torch.device) -> int | None:
    """The CUDA device index to pass `torch.cuda.current_stream`: an int skips its slow lookup
    of a device (about 20 us of host time a call, profiled on the H200's host); None off CUDA."""
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


class PinnedRing:
    """Persistent pinned int64 buffers used in turn: `copy(values, dst)` writes the values (a
    list of ints or an int64 `array.array`) into the next buffer and copies them into the
    contiguous device tensor `dst` without a sync. A buffer is written again only once the copy
    that last read it has run (an event each), so the host never overwrites what a queued copy
    has yet to read."""

    def __init__(self, size: int, device: torch.device, slots: int = 4):
        device = torch.device(device)
        cuda = device.type == "cuda"
        self.buffers = [torch.empty(size, dtype=torch.long, pin_memory=cuda) for _ in range(slots)]
        self.events = [torch.cuda.Event() if cuda else None for _ in range(slots)]
        self.used = [False] * slots
        self.index = stream_index(device)
        self.turn = 0

    def copy(self, values, dst: torch.Tensor) -> None:
        n = len(values)
        assert dst.is_contiguous() and dst.numel() == n <= self.buffers[0].numel()
        i = self.turn
        self.turn = (i + 1) % len(self.buffers)
        if self.used[i]:
            self.events[i].synchronize()
        # array.array converts a list of ints about 6x faster than torch.tensor (and needs no
        # numpy, which the standalone engine does not import)
        if n:  # frombuffer refuses an empty buffer
            if not isinstance(values, array.array):
                values = array.array("q", values)
            self.buffers[i][:n].copy_(torch.frombuffer(values, dtype=torch.long))
        dst.copy_(self.buffers[i][:n].view(dst.shape), non_blocking=True)
        if self.events[i] is not None:  # a CPU copy is done when copy_ returns
            self.events[i].record(torch.cuda.current_stream(self.index))
            self.used[i] = True
