"""Interleaved RoPE: the same as the reference's helper, and observably not rotate-half."""

import torch

from evaluator.reference_model import apply_rope as reference_apply_rope
from evaluator.reference_model import rope_cos_sin
from variants.layers.rope import RopeTable, apply_rope


def rotate_half(x, cos, sin):
    """The HF convention: pairs (j, j + d/2)."""
    c, s = torch.cat([cos, cos], -1)[:, None], torch.cat([sin, sin], -1)[:, None]
    x1, x2 = x.chunk(2, dim=-1)
    return x * c + torch.cat([-x2, x1], dim=-1) * s


def test_table_equals_the_reference_tables():
    table = RopeTable(24, 512, 10000.0, torch.device("cpu"), torch.float16)
    cos, sin = rope_cos_sin(512, 24, 10000.0, torch.float16, torch.device("cpu"))
    assert table.cos.shape == (512, 12) and table.cos.dtype == torch.float16
    assert torch.equal(table.cos, cos) and torch.equal(table.sin, sin)
    positions = torch.tensor([0, 7, 511, 7])
    got_cos, got_sin = table.at(positions)
    assert torch.equal(got_cos, cos[positions]) and torch.equal(got_sin, sin[positions])
    assert torch.equal(got_cos[0], torch.ones(12, dtype=torch.float16))


def test_apply_rope_equals_the_reference_on_random_data():
    gen = torch.Generator().manual_seed(1)
    n, heads, d = 37, 4, 24
    x = torch.randn(n, heads, d, generator=gen)
    positions = torch.randint(0, 512, (n,), generator=gen)
    cos, sin = rope_cos_sin(512, d, 10000.0, torch.float32, torch.device("cpu"))
    cos, sin = cos[positions], sin[positions]
    out = apply_rope(x, cos, sin)
    # The reference takes [..., T, d] with cos/sin [T, d/2]: heads first.
    expected = reference_apply_rope(x.transpose(0, 1), cos, sin).transpose(0, 1)
    assert out.shape == x.shape
    assert torch.allclose(out, expected, atol=1e-6, rtol=0)
    assert not torch.allclose(out, rotate_half(x, cos, sin), atol=1e-2)
    # A rotation: norms of every pair are kept.
    assert torch.allclose(out.norm(dim=-1), x.norm(dim=-1), atol=1e-5)


def test_pairs_are_adjacent_dims():
    x = torch.zeros(1, 1, 4)
    x[0, 0, 0] = 1.0  # the first pair is (dim 0, dim 1)
    angle = torch.tensor([[0.5, 0.0]])
    out = apply_rope(x, angle.cos(), angle.sin())
    expected = torch.tensor([0.5]).cos().item(), torch.tensor([0.5]).sin().item(), 0.0, 0.0
    assert torch.allclose(out[0, 0], torch.tensor(expected))


def test_float16_rope_matches_the_reference():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(9, 2, 24, generator=gen).half()
    cos, sin = rope_cos_sin(9, 24, 10000.0, torch.float16, torch.device("cpu"))
    out = apply_rope(x, cos, sin)
    assert out.dtype == torch.float16
    assert torch.equal(out, reference_apply_rope(x.transpose(0, 1), cos, sin).transpose(0, 1))
