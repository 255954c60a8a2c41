"""The L2 prefetch's host rule: only on CUDA, and only where L2 holds the bytes twice over. The
prefetch itself is inline PTX, run on the GPU by the decode attention's tests."""

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from variants.kernels import prefetch  # noqa: E402


def test_never_off_cuda():
    assert not prefetch.l2_holds("cpu", 1)


@pytest.mark.parametrize(
    "l2, nbytes, holds",
    [(50 << 20, 19 << 20, True), (6 << 20, 19 << 20, False), (38 << 20, 19 << 20, True),
     (0, 1, False)],
)  # fmt: skip
def test_needs_twice_the_bytes_in_l2(monkeypatch, l2, nbytes, holds):
    """An H200 (50 MB) holds a public layer (19 MB) twice; an RTX 3090 (6 MB) does not."""
    monkeypatch.setattr(prefetch, "_l2_bytes", lambda device: l2)
    assert prefetch.l2_holds(torch.device("cuda", 0), nbytes) is holds
