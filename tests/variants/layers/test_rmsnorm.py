"""rms_norm: the reference's cast order (float32 statistics, cast back, then the weight)."""

import pytest
import torch

from evaluator.reference_model import rms_norm as reference_rms_norm
from variants.layers.rmsnorm import rms_norm


@pytest.fixture
def half_inputs():
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 96, generator=gen) * 3).half()
    w = (1 + torch.randn(96, generator=gen)).half()
    return x, w


def test_float16_matches_the_hand_computed_cast_order(half_inputs):
    """The contract's formula, written out: float32 x * rsqrt(mean(x^2) + eps), cast to
    float16, then times the float16 weight."""
    x, w = half_inputs
    xf = x.float()
    expected = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).half() * w
    out = rms_norm(x, w, 1e-5)
    assert out.dtype == torch.float16
    assert torch.equal(out, expected)
    assert torch.equal(out, reference_rms_norm(x, w, 1e-5))


def test_the_weight_is_applied_after_the_cast(half_inputs):
    """Scaling in float32 and casting last gives other fp16 values: the order is observable."""
    x, w = half_inputs
    xf = x.float()
    other_order = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * w.float()).half()
    out = rms_norm(x, w, 1e-5)
    assert not torch.equal(out, other_order)
    assert (out.float() - other_order.float()).abs().max() < 0.05


def test_float32_values_and_eps():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    w = torch.tensor([1.0, 2.0])
    out = rms_norm(x, w, 0.0)
    rms = (12.5) ** 0.5
    assert torch.allclose(out[0], torch.tensor([3 / rms, 8 / rms]))
    # eps keeps an all-zero row finite.
    assert torch.equal(rms_norm(x, w, 1e-5)[1], torch.zeros(2))
