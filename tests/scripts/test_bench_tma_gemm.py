"""scripts/bench_tma_gemm.py: the TMA GEMM it times matches torch, plain and with the norm
prologue, under Triton's interpreter (the timing itself runs on the device)."""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

bench = pytest.importorskip("scripts.bench_tma_gemm")
if bench.TensorDescriptor is None:
    pytest.skip("this Triton has no host tensor descriptors", allow_module_level=True)


@pytest.mark.parametrize("tiles", [(64, 64, 64, 3, 4), (64, 32, 32, 2, 4)])
def test_plain_and_prologue_match_torch(tiles):
    torch.manual_seed(0)
    x = torch.randn(64, 128, dtype=torch.float16)
    w = torch.randn(96, 128, dtype=torch.float16) * 0.05  # N not a multiple of 64: clipped
    out = torch.full((64, 96), float("nan"), dtype=torch.float16)
    want = F.linear(x.float(), w.float())
    got = bench.tma_linear(x, w, out, tiles).float()
    assert not got.isnan().any() and (got - want).abs().max().item() < 2e-3
    rstd, g = torch.rand(64) + 0.5, torch.rand(128, dtype=torch.float16) + 0.5
    h = bench.normed(x, rstd, g)
    assert h.dtype == torch.float16 and not torch.equal(h, x)
    got = bench.tma_linear(x, w, out, tiles, (rstd, g)).float()
    assert (got - F.linear(h.float(), w.float())).abs().max().item() < 2e-3
    assert (got - want).abs().max().item() > 0.05  # the prologue changed the result


def test_shapes_are_the_public_models_projections():
    assert bench.SHAPES == {
        "qkv": (2304, 768), "output": (768, 768), "gate-up": (6144, 768), "down": (768, 3072),
    }  # fmt: skip
    assert set(bench.PROLOGUE_SHAPES) <= set(bench.SHAPES)
    assert len(bench.TILES) == 16 and all(k == 64 for _, _, k, _, _ in bench.TILES)
