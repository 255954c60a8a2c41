"""host_tensor: small index tensors built on the host and placed on the device."""

import array

import pytest
import torch

from variants.staging import (
    PinnedRing,
    host_tensor,
    int_fill,
    int_range,
    stream_index,
    write_host,
)


def test_host_tensor_on_cpu():
    t = host_tensor([[1, 2], [3, 4]], torch.long, torch.device("cpu"))
    assert t.dtype == torch.long and t.device.type == "cpu"
    assert t.tolist() == [[1, 2], [3, 4]]
    r = host_tensor(range(3), torch.int32, torch.device("cpu"))
    assert r.dtype == torch.int32 and r.tolist() == [0, 1, 2]


def test_pinned_ring_copies_each_call_into_its_destination():
    ring = PinnedRing(6, torch.device("cpu"), slots=2)
    first, second, third = (torch.zeros(shape, dtype=torch.long) for shape in [(2, 3), 4, 1])
    ring.copy([1, 2, 3, 4, 5, 6], first)
    ring.copy(array.array("q", [7, 8, 9, 10]), second)  # an int64 array as it is
    ring.copy([11], third)  # reuses the first buffer
    assert first.tolist() == [[1, 2, 3], [4, 5, 6]]
    assert second.tolist() == [7, 8, 9, 10] and third.tolist() == [11]
    assert ring.turn == 1


def test_pinned_ring_and_write_host_take_the_first_count_values_of_an_array():
    values = array.array("q", [4, 5, 6, 7, 8])
    ring = PinnedRing(6, torch.device("cpu"), slots=1)
    dst = torch.zeros(3, dtype=torch.long)
    ring.copy(values, dst, 3)
    assert dst.tolist() == [4, 5, 6]
    buffer = torch.full((4,), -1, dtype=torch.long)
    write_host(values, buffer, 2)
    assert buffer.tolist() == [4, 5, -1, -1]
    with pytest.raises(AssertionError):  # more than the buffer holds
        write_host(values, buffer, 5)


def test_pinned_ring_refuses_more_values_than_a_buffer_holds():
    ring = PinnedRing(2, torch.device("cpu"))
    with pytest.raises(AssertionError):
        ring.copy([1, 2, 3], torch.zeros(3, dtype=torch.long))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_pinned_ring_never_overwrites_a_queued_copy():
    """Two buffers, many queued copies behind a long kernel: each destination gets its values."""
    device = torch.device("cuda")
    ring = PinnedRing(64, device, slots=2)
    big = torch.randn(4096, 4096, device=device)
    outs = [torch.empty(64, dtype=torch.long, device=device) for _ in range(12)]
    for i, out in enumerate(outs):
        big = big @ big  # keeps the stream busy while the host queues the next copy
        ring.copy([i * 100 + j for j in range(64)], out)
    torch.cuda.synchronize()
    assert [o.tolist() for o in outs] == [[i * 100 + j for j in range(64)] for i in range(12)]


def test_stream_index_is_an_int_on_cuda_only():
    assert stream_index(torch.device("cpu")) is None
    if torch.cuda.is_available():
        assert stream_index(torch.device("cuda")) == torch.cuda.current_device()
        assert stream_index(torch.device("cuda", 0)) == 0


def test_int_range_slices_a_run_that_grows_on_demand():
    assert int_range(3, 7).tolist() == [3, 4, 5, 6] and int_range(5, 5).tolist() == []
    far = int_range(100_000, 100_003)  # past the cached run: it grows
    assert far.typecode == "q" and far.tolist() == [100_000, 100_001, 100_002]
    grown = int_range(0, 10)
    grown[0] = -1  # a slice is a copy: the cached run is untouched
    assert int_range(0, 2).tolist() == [0, 1]


def test_int_fill_repeats_a_value():
    assert int_fill(-1, 3).tolist() == [-1, -1, -1] and len(int_fill(9, 0)) == 0
