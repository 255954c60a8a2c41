"""Fused projections (concatenated rows, one matmul) compute what the separate ones do."""

import torch
import torch.nn.functional as F

from variants.layers.projections import gated_mlp, project_qkv


def test_fused_qkv_equals_separate():
    gen = torch.Generator().manual_seed(3)
    h = torch.randn(11, 64, generator=gen)
    wq, wk, wv = (torch.randn(n, 64, generator=gen) * 0.1 for n in (96, 48, 48))
    fused = project_qkv(h, [torch.cat([wq, wk, wv])], 96, 48)
    separate = project_qkv(h, [wq, wk, wv], 96, 48)
    assert [t.shape for t in fused] == [(11, 96), (11, 48), (11, 48)]
    for a, b, w in zip(fused, separate, (wq, wk, wv)):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-6)
        assert torch.allclose(b, h @ w.T, atol=1e-5)


def test_fused_gate_up_equals_separate():
    gen = torch.Generator().manual_seed(4)
    h = torch.randn(5, 64, generator=gen)
    gate, up = torch.randn(96, 64, generator=gen) * 0.1, torch.randn(96, 64, generator=gen) * 0.1
    down = torch.randn(64, 96, generator=gen) * 0.1
    fused = gated_mlp(h, [torch.cat([gate, up])], down)
    separate = gated_mlp(h, [gate, up], down)
    expected = F.linear(F.silu(h @ gate.T) * (h @ up.T), down)
    assert fused.shape == (5, 64)
    assert torch.allclose(fused, separate, atol=1e-6, rtol=1e-6)
    assert torch.allclose(separate, expected, atol=1e-5)
    # gate and up are not interchangeable: the order of the concatenation matters.
    swapped = gated_mlp(h, [torch.cat([up, gate])], down)
    assert not torch.allclose(swapped, expected, atol=1e-3)
