"""Packed <-> padded: a round trip is the identity, padded rows sit on the right."""

import torch

from variants.attention.padding import from_padded, to_padded


def test_round_trip_ragged(prefill_batch):
    batch = prefill_batch([3, 1, 5])
    x = torch.arange(9 * 2 * 4, dtype=torch.float32).view(9, 2, 4)
    padded = to_padded(x, batch)
    assert padded.shape == (3, 2, 5, 4)
    assert torch.equal(padded[1, :, 0], x[3])  # request 1's only token
    assert torch.equal(padded[1, :, 1:], torch.zeros(2, 4, 4))  # right padding
    assert torch.equal(padded[2, :, 4], x[8])
    assert torch.equal(from_padded(padded, batch), x.reshape(9, 8))
    assert batch.last_index.tolist() == [2, 3, 8]


def test_round_trip_uniform_is_a_reshape(prefill_batch):
    batch = prefill_batch([4, 4])
    x = torch.randn(8, 2, 3)
    padded = to_padded(x, batch)
    assert batch.pad_index is None and padded.shape == (2, 2, 4, 3)
    assert padded.data_ptr() == x.data_ptr()  # a view, no copy
    assert torch.equal(from_padded(padded, batch), x.reshape(8, 6))
