"""Host-to-device staging for the small per-call index tensors (positions, slots, tables).

On CUDA a copy from pageable memory synchronises the stream; a copy from pinned memory with
`non_blocking=True` does not. `host_tensor` pins a fresh tensor per call (the eager paths);
`PinnedRing` keeps a few pinned buffers for the CUDA-graph paths, which stage every call."""

import array
import ctypes

import torch

_RUN = array.array("q")  # 0, 1, 2, ... grown on demand: int_range slices it


def int_range(start: int, stop: int) -> array.array:
    """array('q', range(start, stop)) as a slice of one cached run: a C copy, far
    cheaper than building it from the range one Python int at a time."""
    global _RUN
    if stop > len(_RUN):
        _RUN = array.array("q", range(max(stop, 2 * len(_RUN), 4096)))
    return _RUN[start:stop]


def int_fill(value: int, count: int) -> array.array:
    """`count` copies of `value` as an int64 array."""
    return array.array("q", (value,)) * count


def host_tensor(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.tensor(values, dtype=dtype)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


def stream_index(device: torch.device) -> int | None:
    """The CUDA device index to pass `torch.cuda.current_stream`: an int skips its slow lookup
    of a device (host time paid on every call); None off CUDA."""
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def write_host(values, buffer: torch.Tensor, count: int | None = None) -> None:
    """Write ints (a list or an int64 `array.array`; of an array, its first `count`) into the
    start of the contiguous int64 CPU tensor `buffer`. array.array converts a list of ints
    faster than torch.tensor (and needs no numpy, which the standalone engine does not
    import); a memmove then writes it without a torch op (frombuffer + copy_ are two, each
    paying torch's dispatch)."""
    if not isinstance(values, array.array) or values.typecode != "q":
        values = array.array("q", values)
    count = len(values) if count is None else count
    assert count <= len(values) and count <= buffer.numel()
    if count:
        ctypes.memmove(buffer.data_ptr(), values.buffer_info()[0], 8 * count)


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
        self.views: dict = {}  # (buffer, length, shape) -> a view made once

    def copy(self, values, dst: torch.Tensor, count: int | None = None) -> None:
        """`count`: of an int64 array, its first `count` values (default: all)."""
        n = len(values) if count is None else count
        assert dst.is_contiguous() and dst.numel() == n <= self.buffers[0].numel()
        i = self.turn
        self.turn = (i + 1) % len(self.buffers)
        if self.used[i]:
            self.events[i].synchronize()
        key = (i, n, dst.shape)
        buffer = self.views.get(key)
        if buffer is None:
            buffer = self.views[key] = self.buffers[i][:n].view(dst.shape)
        write_host(values, buffer, n)
        dst.copy_(buffer, non_blocking=True)
        if self.events[i] is not None:  # a CPU copy is done when copy_ returns
            self.events[i].record(torch.cuda.current_stream(self.index))
            self.used[i] = True
